"""The drainer's count of each tenant's starts in the current engine step, for the pacing
rule of ``policies.tenant_pace`` (tenants over their share start at most one request a step
while their tier is shared).

A step is told apart by the engine's step counter (``EngineStats.scheduler.num_steps``):
requests started while step k runs join step k + 1, so the count restarts whenever the
counter moves. Nothing here talks to Redis or the engine beyond reading that counter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from policies.tenant_pace import paced


class TenantPace:
    def __init__(self, step_count: Callable[[], int]) -> None:
        self._step_count = step_count
        self._step: int | None = None
        self._started: Counter[tuple[str, str]] = Counter()  # (tier, tenant) -> starts

    def _sync(self) -> None:
        step = self._step_count()
        if step != self._step:
            self._step = step
            self._started.clear()

    def started(self, starts: Iterable[tuple[str, str]]) -> None:
        """Count the ``(tier, tenant)`` of each request just handed to the engine (of the
        paced tiers only: nothing to count reads no step counter)."""
        starts = list(starts)
        if starts:
            self._sync()
            self._started.update(starts)

    def skip(self, tier: str, held: Mapping[str, int], weights: Mapping[str, float],
             seats: int) -> frozenset[str]:
        """The tenants of ``tier`` the pick skips for the rest of this step."""
        self._sync()
        started = {t: n for (ti, t), n in self._started.items() if ti == tier}
        return paced(held, weights, seats, started)
