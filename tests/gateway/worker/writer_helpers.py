"""A worker's output writer in tests: waiting for it, and counting its Redis calls."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.bus.queues import StepWrite
from gateway.worker.writer import OutputWriter


class CountingWriter(OutputWriter):
    """An ``OutputWriter`` that counts the step writes Redis answered (``writes``): a write
    sent from ``submit`` counts once its reply is in, one made by the task once it returns. A
    failed write does not count; its retry does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes = 0
        entries = self._entries
        write_step, send_step_now = entries.write_step, entries.send_step_now

        async def counted_write(step: StepWrite) -> None:
            await write_step(step)
            self.writes += 1

        def counted_send(step: StepWrite) -> asyncio.Future[Any] | None:
            reply = send_step_now(step)
            if reply is not None:
                reply.add_done_callback(self._count_reply)
            return reply

        entries.write_step = counted_write  # type: ignore[method-assign]
        entries.send_step_now = counted_send  # type: ignore[method-assign]

    def _count_reply(self, reply: asyncio.Future[Any]) -> None:
        if not reply.cancelled() and reply.exception() is None:
            self.writes += 1


async def flushed(writer: OutputWriter, timeout_s: float = 10.0) -> None:
    """Until the writer is idle: what was submitted so far is written (its task must run)."""
    async with asyncio.timeout(timeout_s):
        while not writer.idle:
            await asyncio.sleep(0.005)
