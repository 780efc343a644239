"""Every serving process (gateway, worker, or both) publishes its Prometheus registry to Redis
once a second while someone watches, so that one reader sees the whole deployment:
``GET /admin/stats``, the console and ``carpool doctor`` (``stats_snapshot.py``). Both sides of
the format live here.

    {ns}:metrics         hash    process id -> {"proc": id, "role": all|gateway|worker,
                                 "ts": unix s, "start": unix s (its counters' zero),
                                 "samples": [[sample name, {label: value}, value], ...]}
    {ns}:metrics:watch   string  set by each stats read, expires after ``WATCH_TTL_S``

The samples are exactly what ``/metrics`` exports for that process (``_created`` timestamps
left out), cumulative as Prometheus keeps them. Collecting a registry costs some milliseconds
of Python (prometheus-client builds a tuple per sample), so a process publishes only while the
watch key exists: nothing is spent unless an operator looks. A reader ignores, and deletes, a
field older than ``STALE_AFTER_S`` (a process that died); the hash expires when nobody publishes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from gateway.bus.client import text
from gateway.bus.keys import RedisKeys

log = logging.getLogger("carpool.telemetry")

PUBLISH_INTERVAL_S = 1.0
STALE_AFTER_S = 5.0
WATCH_TTL_S = 120  # publishing goes on this long after the last stats read

# One process's samples by sample name, then by its sorted label pairs.
LabelKey = tuple[tuple[str, str], ...]
Samples = dict[str, dict[LabelKey, float]]


@dataclass(frozen=True)
class Published:
    role: str
    start: float  # unix seconds when its counters were zero
    samples: Samples


def process_id(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}"


def registry_samples(registry: CollectorRegistry) -> list[list[Any]]:
    return [[s.name, s.labels, s.value]
            for family in registry.collect() for s in family.samples
            if not s.name.endswith("_created")]


class MetricsPublisher:
    def __init__(self, redis: Any, keys: RedisKeys, registry: CollectorRegistry, role: str,
                 proc: str | None = None, interval_s: float = PUBLISH_INTERVAL_S) -> None:
        self.redis = redis
        self.keys = keys
        self.registry = registry
        self.role = role
        self.proc = proc or process_id(role)
        self.interval_s = interval_s
        self.start = time.time()  # created with the process's telemetry, before any request

    def payload(self) -> bytes:
        return orjson.dumps({"proc": self.proc, "role": self.role, "ts": time.time(),
                             "start": self.start, "samples": registry_samples(self.registry)})

    async def publish(self) -> None:
        # collect + encode off the event loop: a few hundred samples, about a millisecond
        payload = await asyncio.to_thread(self.payload)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.metrics, self.proc, payload)
        pipe.pexpire(self.keys.metrics, int(STALE_AFTER_S * 2000))
        await pipe.execute()

    async def run(self) -> None:
        """Publish every ``interval_s`` while watched, until cancelled; a failed round is
        logged, not fatal."""
        while True:
            try:
                if await self.redis.exists(self.keys.metrics_watch):
                    await self.publish()
            except Exception:  # Redis away: the reader sees this process go stale
                log.debug("metrics publish failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    async def withdraw(self) -> None:
        """Remove this process's field (at stop): readers no longer count it."""
        await self.redis.hdel(self.keys.metrics, self.proc)


def parse_samples(rows: list[list[Any]]) -> Samples:
    out: Samples = {}
    for name, labels, value in rows:
        out.setdefault(name, {})[tuple(sorted(labels.items()))] = float(value)
    return out


def parse_published(raw: Mapping[Any, Any], now: float) -> dict[str, Published]:
    """The hash's live fields by process id. Pure; stale or unreadable fields left out."""
    procs: dict[str, Published] = {}
    for field, value in raw.items():
        try:
            doc = orjson.loads(value)
            if float(doc["ts"]) < now - STALE_AFTER_S:
                continue
            procs[text(field)] = Published(str(doc.get("role", "?")), float(doc["start"]),
                                           parse_samples(doc["samples"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.debug("unreadable metrics field %r", field)
    return procs


async def watch(redis: Any, keys: RedisKeys) -> None:
    """Someone reads the stats: every process publishes for the next ``WATCH_TTL_S``."""
    await redis.set(keys.metrics_watch, b"1", ex=WATCH_TTL_S)


async def read_published(redis: Any, keys: RedisKeys) -> dict[str, Published]:
    """Every live process's samples; stale fields are deleted on the way."""
    raw = await redis.hgetall(keys.metrics)
    now = time.time()
    procs = await asyncio.to_thread(parse_published, raw, now)
    stale = [f for f in raw if text(f) not in procs]
    if stale:
        await redis.hdel(keys.metrics, *stale)
    return procs
