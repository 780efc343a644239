"""Data-loss recovery on the HTTP side: a Redis that came back empty is noticed and the
gateway loads again what it was started with, without a restart.

Every gateway process sets ``{ns}:epoch`` at start (``restore`` then the marker) and checks
every ``CHECK_S`` that it is still there (one EXISTS). A missing marker means Redis lost its
data (restarted without persistence, flushed, failed over to an empty replica): the gateway
loads the tenants file and registers the admin key it was given again, sets the marker, and
says once in the log what it could not restore: tenants and keys made at run time (through
``carpool tenants`` or the admin API) are gone and must be made again by an operator. The
requests it relays that have had no output yet lost their queue entries with the data: each
is answered at once (503 ``backend_unavailable``, retry) instead of waiting to its deadline;
one with output goes on, its worker still writes the rest.
Workers need nothing from here: a queue stream and its group are made again by the next
admission, and a pick or reclaim that finds a stream without its group
(``NOGROUP``) makes the group again (``bus/queues.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.bus.backoff import stop_tasks
from gateway.bus.keys import RedisKeys
from gateway.bus.outage import UNREACHABLE, ErrorOnce
from gateway.config import GatewayConfig
from gateway.http.shutdown import Endable
from gateway.tenancy.tenants import TenantStore, load_tenants_file

log = logging.getLogger("carpool.gateway")

CHECK_S = 1.0


async def restore(store: TenantStore, config: GatewayConfig) -> int:
    """Load the tenants file and register the admin key this process was started with
    (idempotent); returns how many tenants the file holds."""
    tenants = load_tenants_file(config.tenants_file) if config.tenants_file else []
    for tenant in tenants:
        await store.put(tenant)
    if config.admin_key:
        await store.add_admin_key(config.admin_key)
    return len(tenants)


class DataLossWatch:
    def __init__(self, redis: Any, keys: RedisKeys, store: TenantStore,
                 config: GatewayConfig, relays: Callable[[], list[Endable]] = list,
                 check_s: float = CHECK_S) -> None:
        self.redis, self.keys, self.store, self.config = redis, keys, store, config
        self.relays = relays  # the open relays (``Shutdown.open_relays``)
        self.check_s = check_s
        self.recoveries = 0  # data losses seen (and restored) since start
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.mark()
        self._task = asyncio.create_task(self._run(), name="data-loss-watch")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task], log)
            self._task = None

    async def mark(self) -> None:
        await self.redis.set(self.keys.epoch, str(time.time()))

    async def check(self) -> bool:
        """Restore and mark again if the marker is gone; whether it was."""
        if await self.redis.exists(self.keys.epoch):
            return False
        n = await restore(self.store, self.config)
        await self.mark()  # after the restore: a restore cut short is tried again
        self.recoveries += 1
        ended = sum(relay.end_if_waiting() for relay in self.relays())
        log.warning("Redis lost its data: reloaded %d tenant(s) from the tenants file%s; "
                    "tenants and keys made at run time are gone and must be made again; "
                    "%d request(s) still queued were lost (answered 503)", n,
                    " and the admin key" if self.config.admin_key else "", ended)
        return True

    async def _run(self) -> None:
        errors = ErrorOnce(log)
        while True:
            await asyncio.sleep(self.check_s)
            try:
                await self.check()
            except UNREACHABLE:
                pass  # Redis away: said once by the loops that need it; checked again next
            except Exception as exc:  # noqa: BLE001  (the watch must go on)
                errors.failed("data-loss watch", exc)
            else:
                errors.ok()
