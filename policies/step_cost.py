"""An online model of one engine step's cost. Pure (numpy, no torch, no I/O).

    seconds ~ a + b * rows + c * tokens + d * kv_tokens

``rows`` are the requests scheduled in the step, ``tokens`` the tokens computed (one per decode
row, a chunk per prefill row), ``kv_tokens`` the sum of the scheduled rows' context lengths
(the KV the attention reads). On a CPU a step's cost grows about linearly in each.

A step may also report its ``prefill_rows`` (rows computing more than one token): the engine
attends those one request at a time, a fixed cost per row that no other column carries
(``per_prefill_row``, fitted beside the four; ``engine.sim.cost`` models it the same way). Why:
without it a lower-tier prompt chunk's ~19 ms a row was spread over the base and the per-token
cost, so the step budget priced a 16-token chunk at half its cost (bench sla's 32-seat row,
traced: base 40 ms, 1.8 ms a token, 19 ms a prefill row).

The coefficients are a non-negative least-squares fit over the last ``window`` observed steps
(a bounded window forgets an old regime, e.g. a machine that got busier). With fewer than
``min_samples`` steps the model falls back to the mean seconds per row (``a = c = d = 0``):
sane with little data, never negative. ``observe`` only appends (cheap enough for an engine's
step thread; a deque append is atomic); ``fit`` does the work and is meant to run now and
then elsewhere (the worker's step budget runs it on a thread, off the event loop). ``predict``
and ``max_rows_within`` use the last fit.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

DEFAULT_WINDOW = 512
MIN_SAMPLES = 16  # below this, the per-row mean: four coefficients need a spread of steps


@dataclass(frozen=True)
class StepCost:
    """Fitted coefficients, all >= 0: seconds = base + per_row*rows + per_token*tokens +
    per_kv_token*kv_tokens."""

    base: float = 0.0
    per_row: float = 0.0
    per_token: float = 0.0
    per_kv_token: float = 0.0

    def predict(self, rows: float, tokens: float, kv_tokens: float) -> float:
        return self.base + self.per_row * rows + self.per_token * tokens + self.per_kv_token * kv_tokens


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ||x w - y|| subject to w >= 0, for a few columns.

    Exact by enumeration: the optimum is the unconstrained least squares on its own support,
    so the best feasible subset solution is it (16 small solves for 4 columns). Columns are
    scaled first (kv_tokens runs to 1e5, the intercept is 1).
    """
    n = x.shape[1]
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    best, best_res = np.zeros(n), float(np.sum(y * y))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = xs[:, cols]
            w, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(w < 0):
                continue
            r = y - sub @ w
            res = float(r @ r)
            if res < best_res * (1 - 1e-12):  # ties keep the smaller support
                best_res = res
                best = np.zeros(n)
                best[list(cols)] = w
    return np.asarray(best / scale)


class StepCostModel:
    def __init__(self, window: int = DEFAULT_WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("need window >= 1 and min_samples >= 1")
        self.min_samples = min_samples
        self._steps: deque[tuple[int, int, int, float, int]] = deque(maxlen=window)
        self.cost = StepCost()
        self.per_prefill_row = 0.0  # seconds a prefill row adds (fitted with ``cost``)
        self.fitted_samples = 0  # steps behind ``cost``

    def observe(self, rows: int, tokens: int, kv_tokens: int, seconds: float,
                prefill_rows: int = 0) -> None:
        """Record one step (an empty step or a bad time teaches nothing and is ignored)."""
        if rows > 0 and seconds >= 0 and math.isfinite(seconds):
            self._steps.append((rows, tokens, kv_tokens, seconds, prefill_rows))

    @property
    def num_samples(self) -> int:
        return len(self._steps)

    def fit(self) -> StepCost:
        """Refit from the window; returns (and keeps) the coefficients."""
        steps = list(self._steps)  # a copy: the step thread may append meanwhile
        self.per_prefill_row = 0.0
        if not steps:
            self.cost = StepCost()
        elif len(steps) < self.min_samples:
            per_row = sum(s / r for r, _, _, s, _ in steps) / len(steps)
            self.cost = StepCost(per_row=per_row)
        else:
            data = np.asarray(steps, dtype=float)
            x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1], data[:, 2],
                                 data[:, 4]])
            w = [float(v) for v in nnls(x, data[:, 3])]
            self.cost, self.per_prefill_row = StepCost(*w[:4]), w[4]
        self.fitted_samples = len(steps)
        return self.cost

    def rows_and_seconds(self) -> list[tuple[int, float]]:
        """(rows, seconds) of each step in the window (the batch bound's rows-only law)."""
        return [(r, sec) for r, _, _, sec, _ in self._steps]

    def mean_kv_per_row(self) -> float:
        """Context length per scheduled row over the window (0 with no data)."""
        rows = sum(r for r, *_ in self._steps)
        return sum(kv for _, _, kv, *_ in self._steps) / rows if rows else 0.0

    def predict(self, rows: float, tokens: float, kv_tokens: float) -> float:
        return self.cost.predict(rows, tokens, kv_tokens)

    def mean_prefill_tokens(self) -> float:
        """Tokens a prefill row computes over the window, on average (a decode row computes
        one; 0 with no prefill row seen)."""
        rows = sum(p for *_, p in self._steps)
        tokens = sum(t - (r - p) for r, t, _, _, p in self._steps if p)
        return tokens / rows if rows else 0.0

    def predict_decode(self, rows: float, kv_per_row: float) -> float:
        """A decode step of ``rows`` rows, one token each, ``kv_per_row`` context each."""
        return self.predict(rows, rows, rows * kv_per_row)

    def decode_row_cost(self, kv_per_row: float) -> float:
        """Seconds one more decode row adds to a step: its row, its token and its context."""
        c = self.cost
        return c.per_row + c.per_token + c.per_kv_token * kv_per_row

    def max_rows_within(self, target_s: float, kv_per_row: float | None = None,
                        limit: int = 1 << 20) -> int:
        """The largest row count (0..``limit``) whose predicted decode step stays within
        ``target_s``; ``kv_per_row`` defaults to the observed mean context per row."""
        kv = self.mean_kv_per_row() if kv_per_row is None else kv_per_row
        marginal = self.decode_row_cost(kv)
        spare = target_s - self.cost.base
        if spare < 0:
            return 0
        if marginal <= 0:
            return limit
        rows = min(limit, math.floor(spare / marginal))
        # floor() on a float quotient can land one off the boundary: settle it on predict.
        while rows > 0 and self.predict_decode(rows, kv) > target_s:
            rows -= 1
        while rows < limit and self.predict_decode(rows + 1, kv) <= target_s:
            rows += 1
        return rows
