"""Redis outages in the logs: said once when Redis becomes unreachable, once when it is back.

A stopped or restarting Redis makes every loop of a process fail on every retry; a traceback
each time buried the log (81 in two short outages). ``OutageLog.of(log)`` is the one record
per logger (a logger is process-wide already: ``carpool.gateway``, ``carpool.worker``), so
all loops of one side share it: the first loop to fail says "unreachable", the first to
succeed afterwards says "back" with the outage's length. Other errors are logged with their
traceback once per distinct message until the loop next succeeds (``ErrorOnce``).
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import ClusterError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Errors that mean "Redis is not there" (refused, reset, timed out, loading its data):
# retried quietly. redis-py's BusyLoadingError is a ConnectionError. On a Redis Cluster, a
# slot whose master is failing over (CLUSTERDOWN, MASTERDOWN) or that is being moved to
# another master (TRYAGAIN: a script's keys are split between the two for the moment; redis-py
# gives up after 16 tries with "TTL exhausted", a ClusterError) is unreachable for as long.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError, ClusterError,
               TryAgainError)

_BY_LOGGER: dict[str, OutageLog] = {}


class OutageLog:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.down_since: float | None = None

    @classmethod
    def of(cls, log: logging.Logger) -> OutageLog:
        """The record shared by every user of ``log``."""
        found = _BY_LOGGER.get(log.name)
        if found is None:
            found = _BY_LOGGER[log.name] = cls(log)
        return found

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, what: str, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.log.warning("Redis unreachable (%s: %s: %s); retrying quietly until it is back",
                             what, type(exc).__name__, exc)

    def ok(self) -> None:
        if self.down_since is not None:
            self.log.warning("Redis reachable again after %.1f s",
                             time.monotonic() - self.down_since)
            self.down_since = None


class ErrorOnce:
    """A loop's other errors: the traceback of each distinct one once, then silence until
    the loop succeeds again (a persistent error must not log on every retry)."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._seen: set[str] = set()

    def failed(self, what: str, exc: BaseException) -> None:
        sig = f"{type(exc).__name__}: {exc}"
        if sig not in self._seen:
            self._seen.add(sig)
            self.log.error("%s failed (%s); retrying", what, sig, exc_info=exc)

    def ok(self) -> None:
        self._seen.clear()
