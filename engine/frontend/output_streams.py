"""The per-request output queues behind an engine's ``generate``.

An engine hands each step's outputs to the event loop; ``put`` routes every output to the
caller waiting on that request in ``generate``. Used by
``engine.frontend.threaded.ThreadedEngine``, the base of the real ``AsyncEngine`` and of the
FAKE echo engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from engine.core.outputs import RequestOutput


class OutputStreams:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[RequestOutput]] = {}

    async def generate(self, request_id: str, add: Callable[[], None],
                       abort: Callable[[], None]) -> AsyncIterator[RequestOutput]:
        """Call ``add`` (which puts the request into the engine) and yield the request's
        outputs up to its finished one. A caller that stops early calls ``abort``, so the
        cancel reaches the scheduler and frees the request's KV blocks."""
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[request_id] = queue  # before ``add``: a refusal may be put at once
        finished = False
        try:
            add()
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                abort()

    def put(self, out: RequestOutput) -> None:
        """Hand ``out`` to its ``generate`` caller, if there is one (event loop only)."""
        queue = self._queues.get(out.request_id)
        if queue is not None:
            queue.put_nowait(out)
