"""What a step costs in the step-cost model's terms (``policies.step_cost``), for the step
budget (``gateway.worker.step_budget``): the price of a prompt token, the share of each second
interactive's own prompts take, the row cap lowered until lower-tier rows *with their prompts*
fit the target (``priced_cap``), and the lower tiers' prompt tokens a capped step may compute
(``prefill_allowance``). Pure functions of a fitted model; safe off the event loop.

A lower-tier row is priced with its prompt: beside the interactive rows the worker holds, each
row under the cap is a lower one that also brings about a prompt token a step
(``LOWER_PROMPT_PER_OUTPUT``: a request has about as many prompt tokens as output tokens; they
reach the step as chunks under the prefill allowance), so the cap is the largest row count
whose decode step plus those rows' prompt tokens stays within the target. Why: TPOT is the mean
step, and the lower prompts ran on top of a cap priced for decode rows alone (bench sla's
32-seat row, traced: decode-only steps at the cap 53 ms against 41 alone, on target; a step
with a lower chunk 120-150 ms, one in four; interactive TPOT 1.52x alone).

The allowance: the tokens the model says fit in what the capped step leaves of the target, at
least ``MIN_LOWER_PREFILL_RATE``, *on average*: the engine banks a step's allowance until it
holds ``LOWER_PREFILL_CHUNK`` tokens and computes them in one step (``engine.core.row_cap.
PrefillCredit``). Without an allowance a burst of lower-tier arrivals prefilled together in
one step several times the target long (bench sla: +250 ms of interactive TTFT). Why an
average: a lower prompt chunk is a prefill row, ~10-13 ms beside ~1.6 ms a token on the
AVX-512 Xeon, so the old floor of 16 tokens in *every* step put ~38 ms on a ~55 ms step
whenever a lower prompt waited, whatever the target left: bench sla's overload TPOT was
1.4-1.6x the budget on a quiet machine. Banked, the same chunk comes once every few steps
and the mean step, interactive's TPOT, stays within the target.
"""

from __future__ import annotations

from policies.step_cost import StepCostModel

# Lower-tier prompt tokens a capped step may always compute while the model is cold (a per-row
# mean cannot price a token), and the chunk the engine banks a warm allowance up to: a KV
# block's worth (the chunk size a step carried before the allowance was an average).
MIN_LOWER_PREFILL_TOKENS = 16
LOWER_PREFILL_CHUNK = MIN_LOWER_PREFILL_TOKENS
# The least a warm allowance gives, on average a step: a chunk every 8 steps, so a short
# lower prompt still starts within a few dozen steps when the cap leaves no time to spare
# (while interactive is backlogged, MIN_LOWER_PREFILL_TOKENS: ``prefill_allowance``). With
# the loop at its floor this is what holds interactive's TPOT over its budget (bench sla's
# overload row, 2026-12-07: 1.02-1.06x in six runs of seven, bulk 0.82-1.52x its reach);
# a chunk every 16 steps held TPOT at 0.87-0.88x in two runs of three, bulk 0.53-0.61x.
MIN_LOWER_PREFILL_RATE = LOWER_PREFILL_CHUNK // 8
# Prompt tokens a lower-tier request computes per output token it yields, about (bench sla's
# requests: ~44 prompt tokens, 32-64 output tokens): what a lower row under the cap costs on
# top of its decode, on average.
LOWER_PROMPT_PER_OUTPUT = 1.0


def token_s(model: StepCostModel) -> float:
    """Seconds a prompt token adds to a step: a token computed and a KV entry read (the fit
    may put a prompt's cost in either: bench sla's 32-seat row had per_token 0)."""
    return model.cost.per_token + model.cost.per_kv_token


def prompt_token_s(model: StepCostModel) -> float:
    """``token_s`` plus the token's share of its prefill row, at the tokens such rows compute
    on average: what a prompt token costs whichever column the fit put it in. Why: prompts of
    one length make tokens and prefill rows collinear; after bench sla's alone row
    (interactive's 44-token prompts only) the fit had per_token 0 and an 80 ms prefill row,
    the allowance priced tokens at the KV entry alone (2,788 tokens), and the overload row's
    first steps carried 130-170 lower prompt tokens beside interactive."""
    tokens = model.mean_prefill_tokens()
    share = model.per_prefill_row / tokens if tokens else 0.0
    return token_s(model) + share


def prompts_busy(model: StepCostModel, prompt_tokens_s: float, starts_s: float) -> float:
    """The share of each second interactive's prompts take at the rate it sends them
    (``prompt_tokens_s``, ``starts_s`` requests a second): their tokens at the model's cost a
    token, and a prefill row each."""
    return token_s(model) * prompt_tokens_s + model.per_prefill_row * starts_s


def priced_cap(model: StepCostModel, cap: int, target: float, urgent_rows: int,
               busy: float) -> int:
    """``cap`` lowered (not under ``urgent_rows``) until the mean step interactive runs in
    stays within ``target``: the decode step at the cap, each lower row's prompt (a token a
    step, in chunks of the allowance, each chunk a prefill row), and interactive's own prompts
    at their rate (``busy`` of each second: a step of t carries their tokens and rows for t:
    t = (decode + lower prompts) / (1 - busy)). Why the mean: TPOT is the mean step; pricing
    the decode step alone at the target left the lower chunks (+51 ms, 17 % of the steps) and
    interactive's prompts on top (bench sla's 32-seat row, traced: decode steps 1.31x alone,
    TPOT 1.53x)."""
    per_token = token_s(model)
    kv = model.mean_kv_per_row()
    room = target * max(0.0, 1.0 - busy)
    while cap > urgent_rows:
        decode = model.predict_decode(cap, kv)
        chunk = (max(MIN_LOWER_PREFILL_TOKENS, (target - decode) / per_token)
                 if per_token > 0 else float(MIN_LOWER_PREFILL_TOKENS))
        lower = LOWER_PROMPT_PER_OUTPUT * (per_token + model.per_prefill_row / chunk)
        if decode + (cap - urgent_rows) * lower <= room:
            break
        cap -= 1
    return cap


def prefill_allowance(model: StepCostModel, cap: int | None, cap_target_s: float | None,
                      cold: bool, backlogged: bool = False) -> int | None:
    """Lower-tier prompt tokens a step under ``cap`` may compute on average (the engine banks
    them into chunks of ``LOWER_PREFILL_CHUNK``): what the target, as the cap is priced
    (``cap_target_s``), leaves beside ``cap`` decode rows, in the model's cost per token, at
    least ``MIN_LOWER_PREFILL_RATE``, or ``MIN_LOWER_PREFILL_TOKENS`` while interactive is
    ``backlogged``: its TPOT is no longer promised and the weights need the lower tiers'
    prompts started (bench sla's backlog row with the smaller floor: best-effort 0.44 of its
    WRR share, 0.62-0.66 with this one) (None: no cap, or tokens cost nothing in the
    model)."""
    per_token = prompt_token_s(model)
    if cap is None or cap_target_s is None:
        return None
    if cold:  # the per-row mean cannot price a token: the smallest allowance
        return MIN_LOWER_PREFILL_TOKENS
    if per_token <= 0:
        return None
    spare = cap_target_s - model.predict_decode(cap, model.mean_kv_per_row())
    floor = MIN_LOWER_PREFILL_TOKENS if backlogged else MIN_LOWER_PREFILL_RATE
    return max(floor, int(spare / per_token))


def fitted_law(model: StepCostModel) -> dict[str, float]:
    """The fitted step-cost law: seconds a step costs = ``base_s`` + ``per_row_s`` rows +
    ``per_token_s`` tokens + ``per_kv_token_s`` context tokens read + ``per_prefill_row_s``
    prompt rows; with the window's mean context per row, prompt tokens per prompt row and its
    step count. Walks the model's window: call it where the model is fed."""
    cost = model.cost
    return {"base_s": cost.base, "per_row_s": cost.per_row, "per_token_s": cost.per_token,
            "per_kv_token_s": cost.per_kv_token, "per_prefill_row_s": model.per_prefill_row,
            "kv_per_row": model.mean_kv_per_row(),
            "prefill_tokens": model.mean_prefill_tokens(),
            "steps": model.fitted_samples}
