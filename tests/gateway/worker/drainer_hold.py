"""Hold a running gateway's drainer (tests that build a backlog first), through the worker's
``pause_draining``/``resume_draining``; the resumed drainer plans the backlog by weight."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def stop_drainer(gw: Any) -> None:
    """Pause the drainer; returns once a blocking read in flight has been handled, so no
    entry queued after this is taken."""
    gw.call(gw.services.worker.pause_draining())


def start_drainer(gw: Any) -> None:
    """Resume the drainer (no-op if it runs)."""
    worker = gw.services.worker

    async def resume() -> None:  # on the gateway's loop: the drainer's events belong to it
        worker.resume_draining()

    gw.call(resume())


@contextlib.contextmanager
def drainer_held(gw: Any) -> Iterator[None]:
    """The drainer pulls nothing inside the block (call ``start_drainer`` to release it
    early); it runs again after the block."""
    stop_drainer(gw)
    try:
        yield
    finally:
        start_drainer(gw)
