"""A virtual clock: the simulator's time, in seconds, moved only by ``advance``/``jump``.

The scheduler takes any ``Callable[[], float]`` as its clock; handing it this one makes every
stamp it writes (first scheduled, first token, finished) and every wait it measures (dynamic
batching's ``max_wait_ms``) virtual.
"""

from __future__ import annotations

import math


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"a step cannot take {seconds!r} seconds")
        self.now += seconds

    def jump(self, to: float) -> None:
        """Idle until ``to`` (never backwards)."""
        self.now = max(self.now, float(to))
