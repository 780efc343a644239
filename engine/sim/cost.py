"""Step-cost models: how long one engine step takes, from the step's shape alone.

A step's shape is what ``policies.step_cost`` models: ``rows`` (requests in the forward pass,
padding rows of a fixed-shape batch included: they are computed too), ``tokens`` (tokens
computed: one per decode row, a chunk per prefill row) and ``kv_tokens`` (the context the
attention reads: each row's ``start_pos + len(tokens)``), plus ``prefill_rows`` (rows computing
more than one token: the engine attends those one request at a time, a fixed cost per row
and layer that a decode row, batched with the others, does not pay), and ``constrained_rows``
(rows that sample under a grammar: each pays its mask, ``engine.runner.grammar_mask``, and its
matcher's advance, a fixed cost per row that no other column carries).

- ``FixedCost(seconds)``: every step costs the same, whatever it holds (seed 000's "50 ms a
  step, prefill counted as zero").
- ``CalibratedCost(StepLaw)``: ``base + per_row*rows + per_token*tokens + per_kv*kv_tokens
  + per_prefill_row*prefill_rows + per_constrained_row*constrained_rows``, the coefficients fitted from the real engine's measured
  steps (``engine.sim.profile``); a plain ``policies.step_cost.StepCost`` is the same law
  with ``per_prefill_row = per_constrained_row = 0``.
- ``ReplayCost(seconds)``: the n-th step costs the n-th of a real run's measured step times
  (validation: it takes the cost model out of a simulator-vs-engine comparison).

Swap copies are not costed (no measurement covers them); a run that swaps says so in its
preemption counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from engine.core.outputs import SchedulerOutput
from policies.step_cost import StepCost


@dataclass(frozen=True, slots=True)
class StepShape:
    rows: int
    tokens: int
    kv_tokens: int
    prefill_rows: int = 0
    constrained_rows: int = 0


def shape_of(out: SchedulerOutput) -> StepShape:
    pad = out.num_padding_rows  # a padding row is one dummy decode token on a 1-token context
    kv = sum(s.start_pos + len(s.token_ids) for s in out.scheduled)
    prefill = sum(1 for s in out.scheduled if len(s.token_ids) > 1)
    # the runner masks exactly the sampling rows with a grammar (model_runner's constrained rows)
    constrained = sum(1 for s in out.scheduled
                      if s.sample and s.sampling_params.structured is not None)
    return StepShape(len(out.scheduled) + pad, out.num_batched_tokens + pad, kv + pad, prefill,
                     constrained)


@dataclass(frozen=True)
class StepLaw(StepCost):
    """``StepCost`` plus a cost per prefill row and one per constrained row (its grammar mask;
    all coefficients >= 0)."""

    per_prefill_row: float = 0.0
    per_constrained_row: float = 0.0

    @classmethod
    def of(cls, cost: StepCost) -> StepLaw:
        return cost if isinstance(cost, StepLaw) else cls(**asdict(cost))

    def predict(self, rows: float, tokens: float, kv_tokens: float,
                prefill_rows: float = 0, constrained_rows: float = 0) -> float:
        return (StepCost.predict(self, rows, tokens, kv_tokens)
                + self.per_prefill_row * prefill_rows
                + self.per_constrained_row * constrained_rows)

    def seconds(self, shape: StepShape) -> float:
        return self.predict(shape.rows, shape.tokens, shape.kv_tokens, shape.prefill_rows,
                            shape.constrained_rows)


class CostModel(Protocol):
    @property
    def name(self) -> str: ...

    def step_seconds(self, shape: StepShape) -> float: ...

    def decode_seconds(self, rows: int, kv_per_row: float,
                       constrained_rows: float = 0) -> float: ...


@dataclass(frozen=True)
class FixedCost:
    seconds: float
    name: str = "fixed"

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"a fixed step cost must be > 0 seconds, got {self.seconds!r}")

    def step_seconds(self, shape: StepShape) -> float:
        return self.seconds

    def decode_seconds(self, rows: int, kv_per_row: float,
                       constrained_rows: float = 0) -> float:
        return self.seconds


@dataclass(frozen=True)
class CalibratedCost:
    cost: StepLaw
    name: str = "calibrated"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost", StepLaw.of(self.cost))  # a plain StepCost is accepted
        if self.decode_seconds(1, 1) <= 0:
            raise ValueError(f"a calibrated step cost must predict > 0 seconds: {self.cost}")

    def step_seconds(self, shape: StepShape) -> float:
        return self.cost.seconds(shape)

    def decode_seconds(self, rows: int, kv_per_row: float,
                       constrained_rows: float = 0) -> float:
        """A decode step of ``rows`` rows, one token each, ``kv_per_row`` context each, of
        which ``constrained_rows`` sample under a grammar (a mean may be fractional)."""
        return self.cost.predict(rows, rows, rows * kv_per_row, 0, constrained_rows)


class ReplayCost:
    """Replays measured step times in order (the last one repeats if the simulation runs
    more steps than were measured)."""

    name = "replayed"

    def __init__(self, seconds: Sequence[float]) -> None:
        if not seconds or min(seconds) < 0:
            raise ValueError("need at least one measured step time, all >= 0")
        self._seconds = list(seconds)
        self._next = 0

    def step_seconds(self, shape: StepShape) -> float:
        i = min(self._next, len(self._seconds) - 1)
        self._next += 1
        return self._seconds[i]

    def decode_seconds(self, rows: int, kv_per_row: float,
                       constrained_rows: float = 0) -> float:
        return sum(self._seconds) / len(self._seconds)
