"""Run one-off torch work (loading, converting) on a thread that exits afterwards.

OpenMP keeps a thread team alive for every thread that ever ran a parallel region. The
engine steps on its own thread; an idle team left on another thread (the main thread, an
executor thread) makes libgomp count more threads than cores, throttle its spin-wait, and
every small op of a step then pays a futex wake-up (measured on 2 cores: a batch-1 decode
step 49 -> 75 ms). Work done here leaves no team behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_on_fresh_thread(fn: Callable[[], T], name: str = "carpool-oneoff") -> T:
    """``fn()`` on a new thread, joined; its exception is re-raised here."""
    result: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result[0]
