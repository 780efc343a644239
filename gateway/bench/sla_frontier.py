"""What the machine's step-cost law lets ``carpool bench sla``'s targets reach (pure functions).

A decode step costs about ``a + b * rows`` seconds, and each running row yields one token a
step, so a row's measured TPOT p50 is the step time and tokens/s times it is the rows a step
held (Little's law). For a tier with a heavy tenant, that tier's own two rows (``light`` alone,
``heavy`` beside it) give such a law (``fit``, ``light_reach``):

- the tier's tokens/s if its batch were held to the step that keeps the light tenant's TTFT
  within ``limit`` x alone (a first token waits for at least one step of the batch it joins,
  so the TTFT ratio is at least the step ratio); and what the heavy row's batch (held to the
  worker's batch bound, ``policies.batch_bound``) yields of the law's asymptote ``1 / b``: what
  the bound gives up;
- the floor under the light tenant's TTFT beside the heavy one: its first token waits for the
  step in progress, then its own step, and both grew from the light row's step to the heavy
  row's: at least ``2 * (heavy step - light step)`` more than alone (``ttft_growth_s``; the
  report takes the heavy row's longest steps, its TPOT p99, for the p99 first token).

Bulk beside interactive is priced with the server's own law instead. A two-point law read off
the alone and FCFS rows put every request's prompt work into its per-row cost (bench sla,
measured: 12-16 ms a row, an intercept of 0, where a decode row costs ~3 ms), and said bulk
could reach nothing. The step budget fits ``policies.step_cost`` to every step the server
runs (rows, tokens, context read, prompt rows) and publishes the fit in its tier status.
``MachineLaw`` is that fit, and ``law_reach`` prices bulk goodput with it: every step
``tpot_limit`` x interactive's alone TPOT long, each second holds ``1 / step`` steps' base
cost plus every request's own work (a row and a prompt row a prompt chunk, its prompt tokens
and the context they read, a decode row a token after the first); what interactive's requests
leave of the second, bulk's fill. Bulk's prompts are priced in the chunks the server's prompt
rows computed on average (the step budget's allowance chunks lower prompts under overload).

Estimates from a noisy machine, printed beside the measured figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One row's operating point: the step time (TPOT p50, s) and output tokens/s."""

    step_s: float
    tokens_s: float

    @property
    def rows(self) -> float:
        return self.step_s * self.tokens_s


@dataclass(frozen=True)
class CostLaw:
    base_s: float  # a
    per_row_s: float  # b

    def step(self, rows: float) -> float:
        return self.base_s + self.per_row_s * rows

    def rows_within(self, step_s: float) -> float:
        return max(0.0, (step_s - self.base_s) / self.per_row_s)

    def tokens_s(self, step_s: float) -> float:
        """Tokens/s of a batch whose step takes ``step_s``."""
        return self.rows_within(step_s) / step_s


def fit(small: Point, large: Point) -> CostLaw | None:
    """The law through two operating points (None when they cannot give a rising one)."""
    d_rows = large.rows - small.rows
    if not (d_rows > 0 and large.step_s > small.step_s):
        return None
    b = (large.step_s - small.step_s) / d_rows
    return CostLaw(max(0.0, small.step_s - b * small.rows), b)


@dataclass(frozen=True)
class LightReach:
    law: CostLaw
    rows: float  # the tier's rows a step within ``ttft_limit`` x light's alone step
    tokens_s: float  # what such a batch yields
    of_heavy: float  # that, over the heavy row's measured tokens/s
    heavy_rows: float  # the rows a step held in the heavy row (Little's law)
    heavy_of_asymptote: float  # the heavy row's tokens/s over the law's ceiling 1 / b


def light_reach(light: Point, heavy: Point, ttft_limit: float = 1.2) -> LightReach | None:
    law = fit(light, heavy)
    if law is None or heavy.tokens_s <= 0:
        return None
    step = ttft_limit * light.step_s
    tokens = law.tokens_s(step)
    return LightReach(law, law.rows_within(step), tokens, tokens / heavy.tokens_s,
                      heavy.rows, heavy.tokens_s * law.per_row_s)


def ttft_growth_s(light: Point, heavy: Point) -> float:
    """The least a first token beside the heavy batch waits more than alone: the step in
    progress and its own step, each longer by the step's growth."""
    return 2 * max(0.0, heavy.step_s - light.step_s)


@dataclass(frozen=True)
class MachineLaw:
    """A server's fitted step law (``StepBudget.law``): seconds = base + per_row rows +
    per_token tokens + per_kv_token context tokens read + per_prefill_row prompt rows."""

    base_s: float
    per_row_s: float
    per_token_s: float
    per_kv_token_s: float
    per_prefill_row_s: float
    kv_per_row: float  # the mean context a row reads
    prefill_tokens: float = 0.0  # the mean tokens a prompt row computed (0: not known)

    @classmethod
    def of(cls, published: dict[str, float] | None) -> MachineLaw | None:
        if not published:
            return None
        return cls(*(float(published[k]) for k in (
            "base_s", "per_row_s", "per_token_s", "per_kv_token_s", "per_prefill_row_s",
            "kv_per_row", "prefill_tokens")))

    @property
    def decode_row_s(self) -> float:
        """What a decode row adds to a step: a row, a token, its context read."""
        return self.per_row_s + self.per_token_s + self.per_kv_token_s * self.kv_per_row

    def prompt_s(self, prompt_tokens: float, chunk_tokens: float | None = None) -> float:
        """What a prompt adds to the steps that compute it, in chunks of ``chunk_tokens``
        (None: one chunk): a row and a prompt row a chunk, each token computed, and the
        context each chunk reads (its own tokens and the chunks before it)."""
        chunk = prompt_tokens if not chunk_tokens or chunk_tokens >= prompt_tokens \
            else chunk_tokens
        k = max(1, math.ceil(prompt_tokens / chunk)) if chunk > 0 else 1
        reads = prompt_tokens + chunk * k * (k - 1) / 2  # chunk j starts at j * chunk
        return (k * (self.per_row_s + self.per_prefill_row_s) + prompt_tokens * self.per_token_s
                + reads * self.per_kv_token_s)


@dataclass(frozen=True)
class Work:
    """A stream of requests: output tokens/s, and each request's prompt and output tokens."""

    tokens_s: float
    prompt_tokens: float
    output_tokens: float
    chunk_tokens: float | None = None  # its prompts come in chunks this long (None: whole)

    def seconds_per_token(self, law: MachineLaw) -> float:
        """Step time each output token costs, its request's prompt shared among its tokens
        (the prompt's last step yields the first token; the others a decode row each)."""
        n = max(1.0, self.output_tokens)
        return ((n - 1) * law.decode_row_s
                + law.prompt_s(self.prompt_tokens, self.chunk_tokens)) / n

    def busy_s(self, law: MachineLaw) -> float:
        """Step time this work takes each second."""
        return self.tokens_s * self.seconds_per_token(law)


def busy_share(law: MachineLaw, step_s: float, works: list[Work]) -> float:
    """The share of each second steps of mean length ``step_s`` take to run ``works``: each
    step's base, and the works' own costs (1: the machine is full at that step length)."""
    return law.base_s / step_s + sum(w.busy_s(law) for w in works)


@dataclass(frozen=True)
class LawReach:
    law: MachineLaw
    interactive: Work  # what it was priced beside
    bulk: Work  # the shape that priced bulk
    step_s: float  # the mean step interactive's TPOT limit allows
    bulk_tokens_s: float  # bulk goodput that fills the machine at that step
    of_fcfs: float  # over the FCFS row's bulk goodput
    tpot_ratio_needed: float  # the TPOT / alone whose step fits share x FCFS bulk (inf: none)


def law_reach(law: MachineLaw, alone_step_s: float, interactive: Work, bulk: Work,
              fcfs_bulk_s: float, tpot_limit: float = 1.3, share: float = 0.8
              ) -> LawReach | None:
    """Bulk goodput the machine's law allows beside ``interactive`` while every step stays
    ``tpot_limit`` x ``alone_step_s`` (interactive's unloaded TPOT) long; ``bulk``'s shape
    (prompt and output tokens) prices it, its rate is ignored. None without the figures."""
    per_token = bulk.seconds_per_token(law)
    if alone_step_s <= 0 or fcfs_bulk_s <= 0 or per_token <= 0:
        return None
    step = tpot_limit * alone_step_s
    free = 1.0 - busy_share(law, step, [interactive])
    tokens = max(0.0, free / per_token)
    rest = 1.0 - interactive.busy_s(law) - share * fcfs_bulk_s * per_token
    need = law.base_s / rest / alone_step_s if rest > 0 else math.inf
    return LawReach(law, interactive, bulk, step, tokens, tokens / fcfs_bulk_s, need)
