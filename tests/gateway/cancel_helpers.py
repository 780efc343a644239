"""Checks shared by the cancellation tests: nothing of a request is left anywhere."""

from __future__ import annotations

import time
from typing import Any

from gateway.bus.keys import RedisKeys
from policies.tiers import TIERS
from tests.gateway.harness import redis_sync
from tests.gateway.queue_helpers import pending, queued


def wait_engine_idle(gw: Any, timeout: float = 20.0) -> Any:
    """Wait until the engine runs nothing and every KV block is free again."""
    deadline = time.monotonic() + timeout
    while True:
        load = gw.engine.load()
        if (load.num_running == 0 and load.num_waiting == 0 and load.num_swapped == 0
                and load.num_free_blocks == load.num_total_blocks):
            return load
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle: {load}")
        time.sleep(0.02)


def leftovers(redis_url: str, namespace: str) -> dict[str, Any]:
    """Output streams, queue entries, pending entries and concurrency leases still in Redis."""
    r = redis_sync(redis_url)
    keys = RedisKeys(namespace)
    try:
        out = {
            "out_streams": sorted(k.decode() for k in r.scan_iter(f"{namespace}:*:out:*")),
            "queued": {t: queued(r, keys, t) for t in TIERS},
            "pending": {t: pending(r, keys, t) for t in TIERS},
            "leases": {k.decode(): r.zcard(k) for k in r.scan_iter(f"{namespace}:*:conc:*")},
        }
    finally:
        r.close()
    out["queued"] = {t: n for t, n in out["queued"].items() if n}
    out["pending"] = {t: n for t, n in out["pending"].items() if n}
    out["leases"] = {k: n for k, n in out["leases"].items() if n}
    return out


def wait_clean(redis_url: str, namespace: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(redis_url, namespace)
        if not any(left.values()):
            return
        if time.monotonic() > deadline:
            r, keys = redis_sync(redis_url), RedisKeys(namespace)
            detail = {m.decode(): r.hgetall(keys.req(m.decode(), k.decode().rsplit(":", 1)[1]))
                      for k in r.scan_iter(f"{namespace}:*:conc:*") for m in r.zrange(k, 0, -1)}
            r.close()
            raise AssertionError(f"left in Redis: {left}; leased requests: {detail}")
        time.sleep(0.05)


def stat(redis_url: str, namespace: str, name: str) -> int:
    r = redis_sync(redis_url)
    try:
        keys = RedisKeys(namespace)  # each shard counts its own tenants' requests
        return sum(int(r.hget(keys.stats(s), name) or 0) for s in keys.shard_range())
    finally:
        r.close()
