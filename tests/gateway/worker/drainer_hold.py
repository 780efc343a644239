"""Hold a running gateway's drainer (tests that build a backlog first): its task is
cancelled, then started again; the restarted drainer plans the backlog by weight."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

# A blocking read (200 ms) in flight when the task is cancelled still ends on the Redis side:
# wait it out, so no entry queued after the hold is delivered to a read nobody takes.
READ_DRAIN_S = 0.4


def stop_drainer(gw: Any) -> None:
    worker = gw.services.worker

    async def stop() -> None:
        task = next(t for t in worker._tasks if t.get_name() == "worker-drainer")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        worker._tasks.remove(task)

    gw.call(stop())
    time.sleep(READ_DRAIN_S)


def start_drainer(gw: Any) -> None:
    """Run the drainer again (no-op if it runs)."""
    worker = gw.services.worker

    async def start() -> None:
        if not any(t.get_name() == "worker-drainer" for t in worker._tasks):
            task = asyncio.create_task(worker.drainer.run(), name="worker-drainer")
            worker._tasks.append(task)

    gw.call(start())


@contextlib.contextmanager
def drainer_held(gw: Any) -> Iterator[None]:
    """The drainer pulls nothing inside the block (call ``start_drainer`` to release it
    early); it runs again after the block."""
    stop_drainer(gw)
    try:
        yield
    finally:
        start_drainer(gw)
