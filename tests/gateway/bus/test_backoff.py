"""``stop_tasks``: a stop waits a bounded time for the loops it cancels."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway.bus.backoff import stop_tasks

LOG = logging.getLogger("carpool.test-stop-tasks")

pytestmark = pytest.mark.timeout(30)


async def test_a_task_that_swallows_its_cancel_does_not_hang_the_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    """A cancel landing on an in-flight redis-py read can be swallowed: the stop waits for
    such a task a bounded time, cancels it once more, names it and goes on (a bench sla
    server was still up minutes after its SIGTERM)."""
    cancels = 0

    async def stubborn() -> None:  # swallows two cancels, ends at the third
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 3:
                    raise

    async def polite() -> None:
        await asyncio.sleep(10)

    tasks = [asyncio.create_task(stubborn(), name="worker-stubborn"),
             asyncio.create_task(polite(), name="worker-polite")]
    await asyncio.sleep(0)
    began = time.monotonic()
    with caplog.at_level("WARNING", logger=LOG.name):
        await stop_tasks(tasks, LOG, timeout_s=0.2)
    assert time.monotonic() - began < 2.0
    await asyncio.sleep(0)  # the second cancel lands
    assert cancels == 2 and tasks[1].cancelled() and not tasks[0].done()
    (warning,) = [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]
    assert "worker-stubborn" in warning and "worker-polite" not in warning
    tasks[0].cancel()  # the third: it ends
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
