"""Keep a long-running loop alive through failures: retry its step with a bounded backoff.

A Redis hiccup (a dropped connection, a failover) must not end a worker task for good: each
loop runs one step at a time; a step that raises is logged and retried after a pause that
doubles from ``FIRST_S`` up to ``MAX_S`` and resets after the next step that succeeds.
Cancellation (``CancelledError``, a ``BaseException``) still ends the loop. An unreachable
Redis is said once per outage (``outage.OutageLog``), any other error once per distinct
message until the loop next succeeds: never a traceback per retry. ``stop_tasks`` ends such
loops within a bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

from gateway.bus.outage import UNREACHABLE, ErrorOnce, OutageLog

FIRST_S = 0.05
MAX_S = 2.0


class Backoff:
    def __init__(self, first_s: float = FIRST_S, max_s: float = MAX_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.delay = 0.0  # 0: the last step succeeded

    def reset(self) -> None:
        self.delay = 0.0

    def next_delay(self) -> float:
        self.delay = min(self.max_s, self.delay * 2 if self.delay else self.first_s)
        return self.delay


async def run_forever(step: Callable[[], Awaitable[None]], name: str,
                      log: logging.Logger) -> NoReturn:
    """Call ``step()`` forever; failures are logged and retried with backoff."""
    backoff, outage, errors = Backoff(), OutageLog.of(log), ErrorOnce(log)
    while True:
        try:
            await step()
        except UNREACHABLE as exc:
            outage.failed(name, exc)
            await asyncio.sleep(backoff.next_delay())
        except Exception as exc:  # noqa: BLE001  (any failure: the loop must go on)
            errors.failed(name, exc)
            await asyncio.sleep(backoff.next_delay())
        else:
            if backoff.delay:  # the first success after failures
                backoff.reset()
                errors.ok()
                outage.ok()


# How long a stop waits for cancelled loops: a loop ends within a Redis round trip or one
# backoff sleep, so 2 s only ever runs out on a swallowed cancel.
STOP_TIMEOUT_S = 2.0


async def stop_tasks(tasks: list[asyncio.Task[None]], log: logging.Logger,
                     timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Cancel ``tasks`` and wait for them, at most ``timeout_s``: a cancel that lands on an
    in-flight redis-py read can be swallowed (``http/output_mux.py`` met it too), and a stop
    must not hang on it. Why: a bench sla server, sent SIGTERM after its last row, was still
    up 7 minutes later, idle, every thread waiting and its engine never shut down. A task
    left running is cancelled once more, named in one warning line and abandoned."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()  # once more: the first may have been swallowed
    if pending:
        log.warning("tasks did not stop within %.0f s; abandoning %s", timeout_s,
                    ", ".join(sorted(t.get_name() for t in pending)))
