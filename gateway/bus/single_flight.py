"""One call in flight, shared: the callers that come while it runs await that call rather than
each making their own (a burst of admissions that finds a cached view stale reads it once)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class SingleFlight:
    """Calls ``fn`` when no call of it is in flight; otherwise awaits the one that is. A
    caller's cancel leaves the call running for the others (shielded). Its failure reaches
    every caller awaiting it, and is retrieved for none left (no "never retrieved" log)."""

    def __init__(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._fn = fn
        self._call: asyncio.Future[None] | None = None

    async def __call__(self) -> None:
        if self._call is None or self._call.done():
            self._call = asyncio.ensure_future(self._fn())
            self._call.add_done_callback(_retrieve)
        await asyncio.shield(self._call)


def _retrieve(call: asyncio.Future[None]) -> None:
    if not call.cancelled():
        call.exception()
