"""The mailbox between the event loop and an engine's step thread.

The loop ``post``s requests and aborts; the step thread ``drain``s them at the top of each step
and, with nothing to do, ``wait``s until something is posted (or a timeout, to re-check its
stop flag). Used by ``engine.frontend.threaded.ThreadedEngine``, the base of the real
``AsyncEngine`` and of the FAKE echo engine.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any


class Inbox:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()

    def post(self, kind: str, payload: Any) -> None:
        """From the loop: queue a message and wake the step thread."""
        self._queue.put((kind, payload))
        self._wake.set()

    def wake(self) -> None:
        """Wake a waiting step thread without a message (e.g. to see its stop flag)."""
        self._wake.set()

    def drain(self) -> Iterator[tuple[str, Any]]:
        """From the step thread: every message posted so far, in order."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return

    def wait(self, timeout: float) -> None:
        """From the step thread: sleep until a post or wake, or ``timeout`` seconds."""
        self._wake.wait(timeout)
        self._wake.clear()

    def qsize(self) -> int:
        return self._queue.qsize()
