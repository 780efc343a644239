"""Holding a worker's drainer, for tests that build a backlog first: a test-side subclass, so
the production ``Worker`` and ``Drainer`` carry no pause switch.

``HeldWorker`` is a ``Worker`` whose drainer (``HeldDrainer``) can be held between rounds. A
running gateway gets one through ``create_app(worker_type=HeldWorker)`` (the fixtures in
``tests/gateway/conftest.py`` pass it); ``stop_drainer``/``start_drainer``/``drainer_held``
hold and release it on the gateway's loop.

What a hold covers: the drainer reads nothing more from the tier queues, and a read in flight
when the hold began has been handled (what it brought is started) by the time ``hold``
returns. It does not stop the rest of the worker: the maintenance loop still reclaims entries
of dead workers idle past the visibility timeout and starts them, cancels still act, and
what runs goes on to its finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from gateway.worker.drainer import Drainer
from gateway.worker.worker import Worker


class HeldDrainer(Drainer):
    """A drainer that waits between rounds while held (``Drainer._step`` is one round)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._go = asyncio.Event()
        self._go.set()
        self._parked = asyncio.Event()  # set while a held loop waits
        self.running = False  # its loop has started (``run``)

    async def run(self) -> None:
        self.running = True
        try:
            await super().run()
        finally:
            self.running = False

    async def _step(self) -> None:
        if self._go.is_set():
            await super()._step()
            return
        self._parked.set()
        try:
            await self._go.wait()
        finally:
            self._parked.clear()
        self.quiet = False  # plan the backlog built meanwhile by weight

    async def hold(self) -> None:
        """Hold the loop; returns once the round in flight is over (at once if not running)."""
        self._go.clear()
        if self.running:
            await self._parked.wait()

    def release(self) -> None:
        self._go.set()


class HeldWorker(Worker):
    """A ``Worker`` whose drainer is a ``HeldDrainer``."""

    drainer: HeldDrainer

    def __init__(self, redis: Any, engine: Any, config: Any, events: Any = None) -> None:
        super().__init__(redis, engine, config, events)
        plain = self.drainer
        self.drainer = HeldDrainer(self.queues, engine, self.consumer, config.tier_weights,
                                   self._start, row_limit=plain.row_limit, held=plain.held)


def _held_drainer(gw: Any) -> HeldDrainer:
    worker = gw.services.worker
    assert isinstance(worker, HeldWorker), "run the gateway with worker_type=HeldWorker"
    return worker.drainer


def stop_drainer(gw: Any) -> None:
    """Hold a running gateway's drainer (see the module docstring for what that covers)."""
    gw.call(_held_drainer(gw).hold())


def start_drainer(gw: Any) -> None:
    """Release the drainer (no-op unless held)."""
    drainer = _held_drainer(gw)

    async def release() -> None:  # on the gateway's loop: the drainer's events belong to it
        drainer.release()

    gw.call(release())


@contextlib.contextmanager
def drainer_held(gw: Any) -> Iterator[None]:
    """The drainer pulls nothing inside the block (call ``start_drainer`` to release it
    early); it runs again after the block."""
    stop_drainer(gw)
    try:
        yield
    finally:
        start_drainer(gw)
