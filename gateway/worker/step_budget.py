"""The step budget: keeps interactive decode steps within their TPOT target by capping how many
rows a step may run while interactive work is present (``EngineClient.set_urgent_row_cap``).

It watches every engine step (``add_step_observer``: on the step thread it only appends the
step's ``SchedulerOutput`` and seconds to a bounded deque), and now and then, on the event loop,
feeds them to an online step-cost model (``policies.step_cost``), refits it and sets the cap
to the largest row count whose predicted decode step stays within the target. The target is
the tier's ``TierSLO.tpot_p99_s`` or, when unset, ``policies.tiers.derived_tpot_target`` of the
small-batch step: measured (the median of the decode steps of that many rows seen,
``policies.tiers.measured_small_step``), predicted by the model until enough were seen; or of
interactive's step alone at the rate it asks, when that is longer (``_target``). A cap
that would allow every seat is lifted (None): with no interactive work present the engine
applies no cap anyway, so lower tiers keep the whole batch.

A lower-tier row is priced with its prompt: beside the ``urgent_rows`` interactive rows the
worker holds, each row under the cap is a lower one that also brings about a prompt token a
step (``LOWER_PROMPT_PER_OUTPUT``: a request has about as many prompt tokens as output
tokens; they reach the step as chunks under the prefill allowance), so the cap is the largest
row count whose decode step plus those rows' prompt tokens stays within the target. Why: TPOT
is the mean step, and the lower prompts ran on top of a cap priced for decode rows alone
(bench sla's 32-seat row, traced: decode-only steps at the cap 53 ms against 41 alone, on
target; a step with a lower chunk 120-150 ms, one in four; interactive TPOT 1.52x alone).
The budget is the *mean* step interactive runs in (``_priced_cap``): each lower chunk also pays
the model's cost per prefill row, and interactive's own prompts, at the rate it sends them,
take their share of every second first; only what is left goes to the decode step and the
lower rows' prompts.

The law is corrected by measurement (``policies.tpot_loop``): the law's figure for
interactive's step alone is raised by what its recent steps alone (interactive rows only,
while this worker held no lower-tier request) measured against the law (``alone_bias``), and
the cap is priced to ``gain`` x the target, the gain moved by how far the mean step
interactive ran in was from the target, once enough such steps gathered (``next_gain``);
never to a cap under interactive's own rows, and not further down while that floor holds.
Why: the law's base moved 31.8 -> 47.8 ms between two bench sla runs, whose overload TPOTs
were 1.25x and 1.82x alone; in a third the law put interactive's step alone 15 % short, the
cap left the lower tiers nothing, and bulk got 0.09 of FCFS. Each step's interactive rows are
counted on the step thread (``ScheduledRequest.priority``).

Cold start: until the model has ``min_samples`` steps it is the mean seconds per row of the
steps seen (``StepCostModel.fit``), and the cap and allowance are provisional ones from it
(the smallest prefill allowance: a per-row mean cannot price a token), refit every
``COLD_REFIT_INTERVAL_S``. Why: a fresh server met by overload had no cap for its first 16
steps, ~4.7 s of prefill-heavy 250-430 ms steps with 26 lower rows beside interactive (bench
sla's 32-seat row, traced: every interactive TTFT over 1.5x alone fell in them). The first
steps are mostly prompts, so the mean overprices a decode row and the cap errs small.

The same steps give the batch bound for non-urgent rows (``row_limit``, ``policies.batch_bound``:
the knee of the tokens/s curve of their seconds-per-row law, or shorter steps for the tightest
lower-tier TTFT target, ``lower_ttft_s``), which the drainer applies, raised to the rows the
cap owes the lower tiers while interactive rows pass it (``owed_lower_rows``).

With the cap goes an allowance of lower-tier prompt tokens per step (``lower_prefill_tokens``):
the tokens the model says fit in what the capped step leaves of the target, at least
``MIN_LOWER_PREFILL_TOKENS``. Without it a burst of lower-tier arrivals prefilled together in
one step several times the target long (bench sla: +250 ms of interactive TTFT).

And whether interactive is backlogged (``urgent_backlogged``): the decode tokens per second it
asks (``demand``: ``urgent_demand.UrgentDemand``, fed by the worker) would keep more rows
running than the decode rows that fit the target, in such steps with the prompt tokens
interactive brings at its rate (``policies.owed_seats.urgent_backlogged``).
Then the engine's row cap and the drainer owe the lower tiers seats by weight for every
interactive row, not only for those past the cap: interactive asks more than the protected
batch gives, its TPOT promise broken by its own load, and the weights are the contract among
backlogged tiers. Never while the model is cold. Under its weight's share, interactive's own
load sets a target it fits (the alone step above), so only a load past the share (in seconds
or in seats, ``policies.tiers.alone_step``) is judged backlogged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from engine.core.outputs import SchedulerOutput
from engine.protocol import EngineClient
from gateway.worker.urgent_demand import UrgentDemand
from policies.batch_bound import row_limit, rows_law
from policies.owed_seats import owed_seats, urgent_backlogged
from policies.step_cost import StepCostModel
from policies.tiers import (
    DEFAULT_TIER_SLOS,
    DEFAULT_TIER_WEIGHTS,
    INTERACTIVE,
    SMALL_BATCH_ROWS,
    SMALL_STEPS_KEPT,
    TierSLO,
    alone_step,
    derived_tpot_target,
    measured_small_step,
    tier_priority,
)
from policies.tpot_loop import (
    ALONE_MAX_AGE_S,
    ALONE_STEPS_KEPT,
    LOOP_STEPS_KEPT,
    LoopStep,
    alone_bias,
    enough,
    next_gain,
)

log = logging.getLogger("carpool.worker")

REFIT_INTERVAL_S = 1.0
# Refit interval while the model is cold (fewer than min_samples steps): the per-row mean
# costs nothing to fit, and each step without a cap can cost interactive a whole prefill.
COLD_REFIT_INTERVAL_S = 0.1
# Lower-tier prompt tokens a capped step may always compute: a KV block's worth, so a short
# prompt starts within a few steps even when the cap leaves no time to spare.
MIN_LOWER_PREFILL_TOKENS = 16
# Prompt tokens a lower-tier request computes per output token it yields, about (bench sla's
# requests: ~44 prompt tokens, 32-64 output tokens): what a lower row under the cap costs on
# top of its decode, on average.
LOWER_PROMPT_PER_OUTPUT = 1.0
# The derived target is logged again when it moved this share since last said. Why: it was
# said once, at the first warm fit, which comes in the start's prompt-heavy steps (bench sla:
# 71 ms from a predicted 55 ms 4-row step, during the calibration), so a server log could not
# tell which target a measured TPOT ratio was held to.
TARGET_LOG_STEP = 0.1
# Interactive, once judged over its weight's share of the machine, counts as under it again
# only below this fraction of the share (``_alone_step``).
SHARE_HYSTERESIS = 0.9


class StepBudget:
    def __init__(self, engine: EngineClient, slo: TierSLO = DEFAULT_TIER_SLOS[INTERACTIVE],
                 urgent_priority: int = tier_priority(INTERACTIVE),
                 model: StepCostModel | None = None,
                 refit_interval_s: float = REFIT_INTERVAL_S,
                 tier_weights: Mapping[str, int] | None = None) -> None:
        self.engine = engine
        self.slo = slo
        self.urgent_priority = urgent_priority
        # Seats under the cap follow the drain weights (by priority): the lower tiers share
        # theirs by weight, and with interactive's own weight they are owed seats in
        # proportion to its rows (``engine.core.row_cap``), so best-effort keeps its share
        # even when interactive alone would fill the cap.
        weights = DEFAULT_TIER_WEIGHTS if tier_weights is None else tier_weights
        self.seat_weights = {tier_priority(t): w for t, w in weights.items()}
        self.model = model or StepCostModel()
        self.refit_interval_s = refit_interval_s
        # Steps seen on the step thread, not yet fed to the model (deque: thread-safe ends):
        # (rows, tokens, context tokens, seconds, prefill rows, interactive rows)
        self._pending: deque[tuple[int, int, int, float, int, int]] = deque(maxlen=4096)
        self._remove: Callable[[], None] | None = None
        # seconds of the last decode-only steps of SMALL_BATCH_ROWS rows (the derived target's
        # reference, ``policies.tiers.measured_small_step``); filled in ``plan``
        self._small_steps: deque[float] = deque(maxlen=SMALL_STEPS_KEPT)
        # (when fed, rows, tokens, context tokens, prefill rows, seconds) of the last steps
        # that ran interactive rows only while the lower tiers held nothing: its step alone,
        # measured, against which the law is checked (``policies.tpot_loop.alone_bias``)
        self._alone_steps: deque[tuple[float, int, int, int, int, float]] = deque(
            maxlen=ALONE_STEPS_KEPT)
        self.clock: Callable[[], float] = time.monotonic
        # what the cap is priced to, as a multiple of the target: the measured loop's
        # correction of the law (``policies.tpot_loop.next_gain``)
        self.gain = 1.0
        self.cap_target_s: float | None = None  # target_s x gain, when set
        self._loop_steps: deque[LoopStep] = deque(maxlen=LOOP_STEPS_KEPT)  # not yet judged
        self._floored = False  # the last cap was interactive's own rows, not the gain's
        # lower-tier requests the worker holds, at the refit before and now (``_read_worker``):
        # the measured alone step is fed only while both are none
        self._lower_held = (0, 0)
        self.target_s: float | None = None  # the TPOT target in force (None: no data yet)
        self._target_said: float | None = None  # the target last logged at info
        self._source_said: str | None = None  # and what it was derived from
        self._over_share = False  # interactive asked its weight's share or more (hysteresis)
        self.cap: int | None = None  # the row cap last set on the engine
        self.row_limit: int | None = None  # the batch bound for non-urgent rows (None: none)
        self.lower_ttft_s: float | None = None  # the tightest lower-tier TTFT target
        self._bound_said: int | None = None  # the bound last logged at info
        self.lower_prefill_tokens: int | None = None  # the allowance set with it
        # the fitted law for the tier status (operators; ``carpool bench sla`` prices its
        # reach with it): set where the model is fitted, read whole elsewhere
        self.law: dict[str, float] | None = None
        self.last_alone_bias: float | None = None  # the last measured alone bias (``_target``)
        self.demand = UrgentDemand()  # what interactive asks (the worker feeds it)
        self.urgent_backlogged = False  # set with the cap: seats owed for every urgent row
        self.urgent_prompt_s = 0.0  # interactive's prompt tokens/s, read with its demand
        self.urgent_starts_s = 0.0  # and its requests started/s (a prefill row each)
        # interactive rows beside which the lower ones are priced (the worker counts its own)
        self.urgent_rows: Callable[[], int] = lambda: SMALL_BATCH_ROWS
        # and the lower tiers' requests it holds (on the event loop)
        self.lower_held: Callable[[], int] = lambda: 0
        self._state = self._snapshot()  # what ``state`` reads: taken again in ``_set``

    def attach(self) -> None:
        """Start watching the engine's steps (idempotent)."""
        if self._remove is None:
            self._remove = self.engine.add_step_observer(self.observe)

    def detach(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None

    def observe(self, out: SchedulerOutput, seconds: float) -> None:
        """On the engine's step thread: the step's shape and one append (microseconds next
        to a step); the model is fed and refit in ``update``."""
        rows = len(out.scheduled)
        if not rows:
            return
        tokens = out.num_batched_tokens
        kv_tokens = tokens + sum(s.start_pos for s in out.scheduled)  # each row's context
        prefill_rows = sum(len(s.token_ids) > 1 for s in out.scheduled)
        urgent = self.urgent_priority
        urgent_rows = sum(s.priority <= urgent for s in out.scheduled)
        self._pending.append((rows, tokens, kv_tokens, seconds, prefill_rows, urgent_rows))

    async def run(self) -> None:
        """Refit and set the cap every ``refit_interval_s`` (a worker task). The fit runs on a
        thread: a few ms of numpy on the event loop every second was a p99 spike for the
        requests it serves (``carpool bench gateway``)."""
        while True:
            cold = self.model.num_samples + len(self._pending) < self.model.min_samples
            await asyncio.sleep(min(self.refit_interval_s, COLD_REFIT_INTERVAL_S)
                                if cold else self.refit_interval_s)
            try:
                self._read_worker()
                self._set(*await asyncio.to_thread(self._plan_with_allowance,
                                                   self.engine.load().max_num_seqs,
                                                   self.demand.tokens_per_s(),
                                                   self.urgent_rows()))
            except Exception:  # a bad fit must not end the loop; the last cap stays
                log.exception("step budget update failed")

    def update(self) -> int | None:
        """Feed the steps seen since the last call to the model, refit, set the cap; returns
        the cap in force."""
        self._read_worker()
        return self._set(*self._plan_with_allowance(self.engine.load().max_num_seqs,
                                                    self.demand.tokens_per_s(),
                                                    self.urgent_rows()))

    def _read_worker(self) -> None:
        """On the event loop: what interactive asks, and the lower tiers' requests held."""
        self.urgent_prompt_s = self.demand.prompt_tokens_per_s()
        self.urgent_starts_s = self.demand.starts_per_s()
        self._lower_held = (self._lower_held[1], self.lower_held())

    def _plan_with_allowance(self, max_rows: int, urgent_tokens_s: float | None,
                             urgent_rows: int = SMALL_BATCH_ROWS
                             ) -> tuple[int | None, int | None, bool]:
        """``plan``, the cap's prefill allowance and whether interactive, asking
        ``urgent_tokens_s``, is backlogged beside it (all walk the model's window: run off
        the event loop)."""
        cap = self.plan(max_rows, urgent_rows, urgent_tokens_s)
        backlogged = cap is not None and not self.cold and self._backlogged(urgent_tokens_s,
                                                                            max_rows)
        return cap, self._prefill_allowance(cap), backlogged

    def _backlogged(self, urgent_tokens_s: float | None, max_rows: int) -> bool:
        """Would interactive, asking ``urgent_tokens_s``, keep more rows running than the
        decode rows within the target, in such steps? Against those rows, not the cap in
        force: that one also prices lower-tier prompts, which interactive's rows do not
        bring (owing on it would judge interactive backlogged whenever lower prompts cost).
        Its own prompts count, at the model's cost per token: decode steps alone were 0.75 of
        the real ones (bench sla, 0.7x per tier: 51 ms modelled against 64-84 ms, 10-13
        interactive rows beside the target's 10, never judged backlogged)."""
        assert self.target_s is not None  # set by plan
        rows = self.model.max_rows_within(self.target_s, limit=max_rows)
        return urgent_backlogged(urgent_tokens_s, rows,
                                 self.model.predict_decode(rows, self.model.mean_kv_per_row()),
                                 self.urgent_prompt_s, self._prompt_token_s())

    def plan(self, max_rows: int, urgent_rows: int = SMALL_BATCH_ROWS,
             urgent_tokens_s: float | None = None) -> int | None:
        """Feed the pending steps to the model, refit and return the cap (None: no cap), the
        rows past ``urgent_rows`` priced with their prompts, the derived target no shorter
        than interactive's step alone at ``urgent_tokens_s`` (``_target``). Touches only the
        model and the pending steps: safe off the event loop."""
        window = self._feed()
        if not self.model.num_samples:
            return None  # no step seen yet
        self.model.fit()  # cold (under min_samples): the per-row mean, a provisional cap
        if not self.cold:  # the batch bound's law needs a spread of steps
            law = rows_law(self.model.rows_and_seconds())
            bound = None if law is None else row_limit(*law, max_rows, self.lower_ttft_s)
            if bound != self.row_limit:
                self._log_bound(bound, max_rows, law)
                self.row_limit = bound
        self.law = self._law()
        target = self._target(urgent_tokens_s, max_rows)
        self._steer(window, target)
        self.cap_target_s = target * self.gain
        cap = self._cap_within(target, max_rows, urgent_rows)
        self._floored = False
        if self.gain != 1.0:
            # the loop takes lower rows away down to none beside interactive's own, never
            # the cap below its rows: that reads as interactive past its budget by its own
            # load, and the lower tiers are owed seats for it (bench sla's 32-seat row,
            # traced: gain 0.5, cap 0, 16-32 rows a step, TPOT 3.66x alone)
            floor = min(cap, urgent_rows)
            cap = self._cap_within(self.cap_target_s, max_rows, urgent_rows)
            self._floored = cap < floor
            cap = max(cap, floor)
        return None if cap >= max_rows else cap

    def _cap_within(self, target: float, max_rows: int, urgent_rows: int) -> int:
        """The largest row count whose step stays within ``target`` (``max_rows`` at most),
        the rows past ``urgent_rows`` priced with their prompts once the model is warm."""
        cap = self.model.max_rows_within(target, limit=max_rows)  # decode rows alone
        if not self.cold:  # a cold model's per-row mean cannot price a token
            cap = self._priced_cap(cap, target, urgent_rows)
        return cap

    def _steer(self, window: list[LoopStep], target: float) -> None:
        """Move the gain once the steps gathered are ``enough`` to judge. Not while cold
        (the loop corrects the law, not the per-row mean) nor while interactive is
        backlogged (its weight decides its seats then, not its TPOT)."""
        steps = self._loop_steps
        steps.extend(window)
        if self.cold or self.urgent_backlogged:
            steps.clear()
        elif enough(steps):
            gain = next_gain(self.gain, steps, target, self.cap, self._lower_held[1] > 0)
            # at the floor a lower gain moves no cap: it would only wind down, and take the
            # cap under the lower tiers' due once interactive's rows fall
            self.gain = max(gain, self.gain) if self._floored else gain
            steps.clear()

    def _feed(self) -> list[LoopStep]:
        """Feed the pending steps to the model and the measured steps (the small decode
        step, interactive alone); returns them as the loop's window."""
        pending, window, now = self._pending, [], self.clock()
        while pending:
            rows, tokens, kv_tokens, seconds, prefill_rows, urgent = pending.popleft()
            self.model.observe(rows, tokens, kv_tokens, seconds, prefill_rows)
            if not prefill_rows and rows == SMALL_BATCH_ROWS:
                self._small_steps.append(seconds)
            if urgent == rows and self._lower_held == (0, 0):
                self._alone_steps.append((now, rows, tokens, kv_tokens, prefill_rows, seconds))
            window.append(LoopStep(seconds, rows, urgent))
        alone = self._alone_steps
        while alone and alone[0][0] < now - ALONE_MAX_AGE_S:
            alone.popleft()
        return window

    def _priced_cap(self, cap: int, target: float, urgent_rows: int) -> int:
        """``cap`` lowered (not under ``urgent_rows``) until the mean step interactive runs
        in stays within ``target``: the decode step at the cap, each lower row's prompt (a
        token a step, in chunks of the allowance, each chunk a prefill row), and
        interactive's own prompts at their rate (a step of t carries their tokens and rows
        for t: t = (decode + lower prompts) / (1 - their share of each second)). Why the
        mean: TPOT is the mean step; pricing the decode step alone at the target left the
        lower chunks (+51 ms, 17 % of the steps) and interactive's prompts on top (bench
        sla's 32-seat row, traced: decode steps 1.31x alone, TPOT 1.53x)."""
        model, token_s = self.model, self._token_s()
        kv = model.mean_kv_per_row()
        room = target * max(0.0, 1.0 - self._urgent_prompts_busy())
        while cap > urgent_rows:
            decode = model.predict_decode(cap, kv)
            chunk = (max(MIN_LOWER_PREFILL_TOKENS, (target - decode) / token_s)
                     if token_s > 0 else float(MIN_LOWER_PREFILL_TOKENS))
            lower = LOWER_PROMPT_PER_OUTPUT * (token_s + model.per_prefill_row / chunk)
            if decode + (cap - urgent_rows) * lower <= room:
                break
            cap -= 1
        return cap

    def _urgent_prompts_busy(self) -> float:
        """The share of each second interactive's prompts take at the rate it sends them:
        their tokens at the model's cost a token, and a prefill row each."""
        return (self._token_s() * self.urgent_prompt_s
                + self.model.per_prefill_row * self.urgent_starts_s)

    def _token_s(self) -> float:
        """Seconds a prompt token adds to a step: a token computed and a KV entry read (the
        fit may put a prompt's cost in either: bench sla's 32-seat row had per_token 0)."""
        return self.model.cost.per_token + self.model.cost.per_kv_token

    def _prompt_token_s(self) -> float:
        """``_token_s`` plus the token's share of its prefill row, at the tokens such rows
        compute on average: what a prompt token costs whichever column the fit put it in.
        Why: prompts of one length make tokens and prefill rows collinear; after bench sla's
        alone row (interactive's 44-token prompts only) the fit had per_token 0 and an 80 ms
        prefill row, the allowance priced tokens at the KV entry alone (2,788 tokens), and the
        overload row's first steps carried 130-170 lower prompt tokens beside interactive."""
        tokens = self.model.mean_prefill_tokens()
        share = self.model.per_prefill_row / tokens if tokens else 0.0
        return self._token_s() + share

    def _law(self) -> dict[str, float] | None:
        """The fitted step-cost law this budget runs on, for ``law``: seconds a
        step costs = ``base_s`` + ``per_row_s`` rows + ``per_token_s`` tokens +
        ``per_kv_token_s`` context tokens read + ``per_prefill_row_s`` prompt rows; with the
        window's mean context per row, prompt tokens per prompt row and its step count.
        None while cold (a per-row mean, not the law). Walks the model's window: called
        where the model is fed (``plan``), never beside it."""
        if self.cold:
            return None
        model, cost = self.model, self.model.cost
        return {"base_s": cost.base, "per_row_s": cost.per_row, "per_token_s": cost.per_token,
                "per_kv_token_s": cost.per_kv_token, "per_prefill_row_s": model.per_prefill_row,
                "kv_per_row": model.mean_kv_per_row(),
                "prefill_tokens": model.mean_prefill_tokens(),
                "steps": model.fitted_samples}

    @property
    def state(self) -> dict[str, Any]:
        """What the budget decided last, for the tier status (operators): the row cap set on
        the engine (None: none), the TPOT target in force and the gain the cap is priced at
        (``target_s x gain = cap_target_s``), ``alone_bias`` (interactive's measured steps
        alone against the law; applied to the target only when above 1; None when not
        measured: a configured target, a cold model, no interactive demand, or too few steps
        alone), whether interactive was judged backlogged (seats owed for every row), the
        lower tiers' prompt tokens a step and their batch bound. One snapshot taken where
        the decision is applied (``_set``, on the event loop), so its values belong together:
        ``plan`` runs on another thread and changes them one by one."""
        return self._state

    def _snapshot(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {"cap": self.cap, "target_s": r(self.target_s), "gain": round(self.gain, 3),
                "cap_target_s": r(self.cap_target_s), "alone_bias": r(self.last_alone_bias),
                "backlogged": self.urgent_backlogged,
                "lower_prefill_tokens": self.lower_prefill_tokens,
                "row_limit": self.row_limit}

    @property
    def cold(self) -> bool:
        """Fewer steps fed than the model's ``min_samples``: the cap is provisional."""
        return self.model.num_samples < self.model.min_samples

    def _log_bound(self, bound: int | None, max_rows: int,
                   law: tuple[float, float] | None) -> None:
        """Say what the bound became: at info when it moved a quarter or more since last
        said (the fit wobbles every refit), else at debug."""
        said = self._bound_said
        big = (bound is None) != (said is None) or (
            bound is not None and said is not None and abs(bound - said) >= said / 4)
        a, m = law or (0.0, 0.0)
        log.log(logging.INFO if big else logging.DEBUG,
                "batch bound %s rows of %s (step ~ %.0f ms + %.2f ms/row)", bound, max_rows,
                a * 1e3, m * 1e3)
        if big:
            self._bound_said = bound

    def _alone_step(self, urgent_tokens_s: float | None, max_rows: int,
                    measured: float | None) -> float | None:
        """The mean step interactive, asking ``urgent_tokens_s`` decode tokens a second with
        its prompts at their rate, would run in alone on ``max_rows`` seats
        (``policies.tiers.alone_step``): None while cold, with no demand known, or when it
        asks its weight's share of the machine or more (then backlogged: the weights decide,
        not its TPOT). Once over the share it must fall to ``SHARE_HYSTERESIS`` of it to
        count as under again: its demand is ~25 starts in a 10 s window, +-20 %, and each
        crossing moves the target and the cap (a refit at a time flipped both)."""
        if self.cold or not urgent_tokens_s:
            return None
        model = self.model
        marginal = model.decode_row_cost(model.mean_kv_per_row())
        weights = self.seat_weights
        share = weights.get(self.urgent_priority, 0) / max(1, sum(weights.values()))
        if self._over_share:
            share *= SHARE_HYSTERESIS
        # the base through the measured small step where there is one (``measured``): the
        # fit's own split of base and per-row cost moves between refits and servers (34-60 ms
        # bases on one machine; a 41 ms one put interactive's step alone at 75 ms against a
        # measured 56 ms TPOT alone), the small step and the slope far less
        alone = alone_step(self._alone_base(measured), marginal, urgent_tokens_s,
                           self._urgent_prompts_busy(), share, max_rows)
        self._over_share = alone is None
        return alone

    def _alone_base(self, measured: float | None) -> float:
        """The base of interactive's step alone: through the measured small step where there
        is one (``measured``), else the fit's."""
        model = self.model
        if measured is None:
            return model.cost.base
        row = model.decode_row_cost(model.mean_kv_per_row())
        return max(0.0, measured - SMALL_BATCH_ROWS * row)

    def _alone_bias(self, measured: float | None) -> float | None:
        """``policies.tpot_loop.alone_bias`` of the kept steps of interactive alone against
        the law's figure for each, on the base its step alone is priced with."""
        model, base = self.model, self._alone_base(measured)
        offset = base - model.cost.base
        return alone_bias([(seconds, offset + model.predict(rows, tokens, kv)
                            + model.per_prefill_row * prefill_rows)
                           for _, rows, tokens, kv, prefill_rows, seconds in self._alone_steps])

    def _target(self, urgent_tokens_s: float | None = None, max_rows: int = 1) -> float:
        """The TPOT target in force: the configured one, else ``derived_tpot_target`` of the
        small-batch step or, when longer, of the step interactive's own load runs in alone
        (``_alone_step``). Why the latter: the promise is TPOT within 1.3x of interactive
        *alone*, and its load alone may run more rows than the small batch; on the AVX-512
        Xeon (step ~ 34 ms + 3.5 ms a row) bench sla's 0.5x-capacity interactive ran 7 rows
        at 72 ms TPOT against a 59 ms target from the 4-row step, so the budget judged it
        backlogged, owed the lower tiers seats for every interactive row and TPOT went to
        1.34-1.59x alone."""
        follows_demand = False
        if self.slo.tpot_p99_s is not None:
            target, how = self.slo.tpot_p99_s, "configured"
        else:
            measured = measured_small_step(self._small_steps)
            if measured is not None:
                small = measured
                how = (f"derived from the measured {SMALL_BATCH_ROWS}-row step, "
                       f"{small * 1000:.0f} ms, median of {len(self._small_steps)}")
            else:
                small = self.model.predict_decode(SMALL_BATCH_ROWS, self.model.mean_kv_per_row())
                how = (f"derived from the predicted {SMALL_BATCH_ROWS}-row step, "
                       f"{small * 1000:.0f} ms")
            target = derived_tpot_target(small)
            alone = self._alone_step(urgent_tokens_s, max_rows, measured)
            basis = f"at its {urgent_tokens_s or 0:.0f} tokens/s"
            bias = self._alone_bias(measured) if alone is not None else None
            self.last_alone_bias = bias
            if alone is not None and bias is not None and bias > 1.0:
                alone *= bias  # the law's figure ran short of its steps alone, measured
                basis += (f", x{bias:.2f} as its {len(self._alone_steps)} steps alone "
                          f"measured")
            if alone is not None and derived_tpot_target(alone) > target:
                target = derived_tpot_target(alone)
                how = f"derived from interactive's step alone, {alone * 1000:.0f} ms {basis}"
                follows_demand = True
        self._say_target(target, how, follows_demand)
        self.target_s = target
        return target

    def _say_target(self, target: float, how: str, follows_demand: bool) -> None:
        """Log the target in force at info when first chosen, when what it is derived from
        changed (``how`` up to its first comma) and when it moved TARGET_LOG_STEP since last
        said; but a target that ``follows_demand`` (interactive's step alone, which moves with
        a demand that is +-20 % between refits) logs its moves at debug. A cold model's
        target is provisional: not said."""
        if self.cold:
            return
        source, said = how.split(",")[0], self._target_said
        moved = said is None or abs(target - said) >= said * TARGET_LOG_STEP
        if source != self._source_said or (moved and not follows_demand):
            self._target_said, self._source_said = target, source
            log.info("interactive TPOT target %.0f ms (%s)", target * 1000, how)
        elif moved:
            log.debug("interactive TPOT target %.0f ms (%s)", target * 1000, how)

    def _prefill_allowance(self, cap: int | None) -> int | None:
        """Lower-tier prompt tokens a step under ``cap`` may compute: what the target, as the
        cap is priced (``cap_target_s``), leaves beside ``cap`` decode rows, in the model's
        cost per token (None: no cap, or tokens cost nothing in the model)."""
        per_token = self._prompt_token_s()
        if cap is None or self.cap_target_s is None:
            return None
        if self.cold:  # the per-row mean cannot price a token: the smallest allowance
            return MIN_LOWER_PREFILL_TOKENS
        if per_token <= 0:
            return None
        spare = self.cap_target_s - self.model.predict_decode(cap, self.model.mean_kv_per_row())
        return max(MIN_LOWER_PREFILL_TOKENS, int(spare / per_token))

    def owed_lower_rows(self, urgent_rows: int) -> int:
        """Lower-tier rows the engine's row cap owes beside ``urgent_rows`` interactive rows
        (``policies.owed_seats``, every lower tier counted): the drainer lets the lower tiers
        hold that many past the batch bound, else those seats find no rows to run."""
        if self.cap is None:
            return 0
        return owed_seats(urgent_rows, self.cap, self.urgent_priority, self.seat_weights,
                          backlogged=self.urgent_backlogged)

    def _set(self, cap: int | None, lower_prefill_tokens: int | None,
             backlogged: bool = False) -> int | None:
        now = (cap, lower_prefill_tokens, backlogged)
        if now != (self.cap, self.lower_prefill_tokens, self.urgent_backlogged):
            self.engine.set_urgent_row_cap(cap, self.urgent_priority, self.seat_weights,
                                           lower_prefill_tokens, backlogged)
            log.debug("urgent row cap %s, lower prefill %s tokens, interactive backlogged %s "
                      "(target %s s, priced at x%.2f)", cap, lower_prefill_tokens, backlogged,
                      self.target_s, self.gain)
            self.cap, self.lower_prefill_tokens, self.urgent_backlogged = now
        self._state = self._snapshot()
        return cap
