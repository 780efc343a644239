"""``SingleFlight``: callers that come while a call runs share it; a caller's cancel leaves it
running for the others; its failure reaches each of them; the next call after it runs anew."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gateway.bus.single_flight import SingleFlight


class Counted:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        await self.release.wait()
        if self.fail:
            raise RuntimeError("read failed")


async def test_callers_share_the_call_in_flight_and_a_later_caller_calls_again() -> None:
    fn = Counted()
    flight = SingleFlight(fn)
    callers = [asyncio.ensure_future(flight()) for _ in range(5)]
    await asyncio.sleep(0)
    callers[0].cancel()  # one caller gives up: the call goes on for the others
    await asyncio.sleep(0)
    fn.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [None] * 4
    assert fn.calls == 1
    await flight()
    assert fn.calls == 2


async def test_a_failure_reaches_every_caller_awaiting_it() -> None:
    fn = Counted(fail=True)
    flight = SingleFlight(fn)
    callers = [asyncio.ensure_future(flight()) for _ in range(3)]
    await asyncio.sleep(0)
    fn.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert [str(r) for r in results] == ["read failed"] * 3
    assert fn.calls == 1
    with pytest.raises(RuntimeError):
        await flight()


async def test_a_failure_no_caller_awaits_is_not_logged_as_never_retrieved() -> None:
    """Its only caller cancelled, the call fails on its own: asyncio would log "exception was
    never retrieved" when the call is collected, unless it was retrieved."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        fn = Counted(fail=True)
        flight = SingleFlight(fn)
        caller = asyncio.ensure_future(flight())
        await asyncio.sleep(0)
        caller.cancel()
        await asyncio.sleep(0)
        fn.release.set()
        for _ in range(3):
            await asyncio.sleep(0)
        del flight, caller
        gc.collect()
        assert fn.calls == 1
        assert reported == []
    finally:
        loop.set_exception_handler(previous)
