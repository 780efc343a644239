"""The hand-off at the end of a worker's drain (``Worker.drain``), on the stopping worker's side.

Past its drain deadline (or at a second SIGTERM) a stopping worker picks another worker
(``find_target``): one whose tier status it has seen change lately (``DeadWorkers.live``, on
its own clock) and that does not say it is draining, the least busy. Once the requests it
ran are stopped and what they produced is written, it names that worker in a ``HandoffMsg``
on the cancel channel (``hand_to``). That worker claims every queue entry the stopping one
holds, at once, and resumes each stream from the tokens its reader already has
(``recovery.py``), as it does a dead worker's, without waiting to find it dead. The stopping
worker waits for its entries to leave it; if they do not, they are still its own, and are
taken over as a dead worker's once it is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from redis.exceptions import RedisError

from gateway.bus.client import text
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import HandoffMsg, encode_payload
from gateway.bus.queues import TierQueues
from gateway.worker.recovery import DeadWorkers

log = logging.getLogger("carpool.worker")

# how long a stopping worker looks for a worker to hand off to, and then waits for it to
# claim what it was handed
HANDOFF_WAIT_S = 5.0


def handoff_target(statuses: dict[Any, Any], live: set[str], me: str) -> str | None:
    """The worker a draining worker hands its requests to: a live one (``live``, judged on
    the drainer's clock) other than ``me`` whose status does not say it drains too, the one
    running the fewest requests (then by id); None when there is none."""
    best: tuple[int, str] | None = None
    for key, raw in statuses.items():
        name = text(key)
        if name == me or name not in live:
            continue
        try:
            status = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(status, dict) or status.get("draining"):
            continue
        running = status.get("running")
        rank = (running if isinstance(running, int) else 0, name)
        best = rank if best is None or rank < best else best
    return None if best is None else best[1]


async def find_target(redis: Any, keys: RedisKeys, dead_workers: DeadWorkers, me: str,
                      busy: Callable[[], bool], wait_s: float = HANDOFF_WAIT_S) -> str | None:
    """``handoff_target`` over the status hash, looked for up to ``wait_s``: a worker that
    has just started publishes its first status a second later (a rolling update stops us as
    soon as our successor is up). None when none shows, or once ``busy()`` is False (our
    requests all finished meanwhile)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while True:
        try:
            statuses = await redis.hgetall(keys.tier_status)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not read the workers' statuses to hand off: %r", exc)
            return None
        dead_workers.observe(statuses, time.monotonic())
        target = handoff_target(statuses, dead_workers.live(time.monotonic()), me)
        if target is not None or not busy() or loop.time() >= end:
            return target
        await asyncio.sleep(0.2)


async def hand_to(redis: Any, keys: RedisKeys, queues: TierQueues, me: str, target: str,
                  wait_s: float = HANDOFF_WAIT_S) -> bool:
    """Tell ``target`` to take every entry ``me`` holds; whether it did within ``wait_s``."""
    await redis.publish(keys.cancel_channel, encode_payload(HandoffMsg(me, target)))
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while loop.time() < end:
        if me not in await queues.pending_consumers():
            return True
        await asyncio.sleep(0.05)
    log.warning("worker %s did not take our requests within %.0f s: they are taken over "
                "as a dead worker's", target, wait_s)
    return False
