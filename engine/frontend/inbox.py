"""The mailbox between the event loop and an engine's step thread.

The loop ``post``s requests and aborts; the step thread ``drain``s them at the top of each step
and, with nothing to do, ``wait``s until something is posted (or a timeout, to re-check its
stop flag). Used by ``engine.frontend.threaded.ThreadedEngine``, the base of the real
``AsyncEngine`` and of the FAKE echo engine.

A message posted with a ``priority`` (a request) counts in ``pending`` until the step thread
has applied it (the ``drain`` consumer's body for it has run): the engine's load then knows
the priority of requests it has not placed yet. Why: counted as urgent, eight best-effort
requests the drainer had just pulled filled interactive's short engine queue, so interactive
was not pulled until the step in progress ended (bench sla's 32-seat row, traced: 99 ms in
Redis, the row's worst TTFT, 2.06x alone).
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any


class Inbox:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any, int | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._pending: Counter[int] = Counter()  # priority -> posted, not yet applied
        self._lock = threading.Lock()  # the loop posts, the step thread drains

    def post(self, kind: str, payload: Any, priority: int | None = None) -> None:
        """From the loop: queue a message and wake the step thread. With ``priority`` it
        counts in ``pending`` until applied."""
        if priority is not None:
            with self._lock:
                self._pending[priority] += 1
        self._queue.put((kind, payload, priority))
        self._wake.set()

    def wake(self) -> None:
        """Wake a waiting step thread without a message (e.g. to see its stop flag)."""
        self._wake.set()

    def drain(self) -> Iterator[tuple[str, Any]]:
        """From the step thread: every message posted so far, in order. A message leaves
        ``pending`` once the consumer asks for the next one (it has been applied)."""
        while True:
            try:
                kind, payload, priority = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                yield kind, payload
            finally:  # applied, or dropped (the consumer stopped or failed)
                if priority is not None:
                    with self._lock:
                        self._pending[priority] -= 1

    def wait(self, timeout: float) -> None:
        """From the step thread: sleep until a post or wake, or ``timeout`` seconds."""
        self._wake.wait(timeout)
        self._wake.clear()

    def pending(self) -> tuple[tuple[int, int], ...]:
        """``(priority, count)`` of the messages posted with a priority and not yet applied,
        ascending by priority."""
        with self._lock:
            return tuple(sorted((p, n) for p, n in self._pending.items() if n > 0))
