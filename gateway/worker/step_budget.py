"""The step budget: keeps interactive decode steps within their TPOT target by capping how many
rows a step may run while interactive work is present (``EngineClient.set_urgent_row_cap``).

It watches every engine step (``add_step_observer``: on the step thread it only appends the
step's ``SchedulerOutput`` and seconds to a bounded deque), and now and then, on the event loop,
feeds them to an online step-cost model (``policies.step_cost``), refits it and sets the cap
to the largest row count whose predicted step stays within the target. The target is the
tier's ``TierSLO.tpot_p99_s`` or one derived from measured steps (``gateway.worker.tpot_target``).
A cap that would allow every seat is lifted (None): with no interactive work present the engine
applies no cap anyway, so lower tiers keep the whole batch.

A lower-tier row is priced with its prompt, and the budget is the *mean* step interactive runs
in: each lower chunk also pays the model's cost per prefill row, and interactive's own prompts,
at the rate it sends them, take their share of every second first; only what is left goes to
the decode step and the lower rows' prompts (``gateway.worker.step_pricing``).

The law is corrected by measurement (``policies.tpot_loop``): the target follows interactive's
measured steps alone (``tpot_target``), and the cap is priced to ``gain`` x the target, the gain
moved by how far the mean step interactive ran in was from the target, once enough such steps
gathered (``next_gain``). Measured steps are *periods* (``MAX_GAP_S``): a row's TPOT is the
time between the steps that run it, and in one process with the HTTP edge the step thread
waits for the GIL between steps (bench sla's alone row on a busy 2-core VM: served TPOT 165
ms against ~100-115 ms targets from compute seconds); never to a cap under interactive's own rows, and not further down
while that floor holds. Each step's interactive rows are counted on the step thread
(``ScheduledRequest.priority``).

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

With the cap goes an allowance of lower-tier prompt tokens a step, on average: the engine banks
it into chunks of ``LOWER_PREFILL_CHUNK`` (``lower_prefill_tokens``,
``step_pricing.prefill_allowance``).

And whether interactive is backlogged (``urgent_backlogged``): the decode tokens per second it
asks (``demand``: ``urgent_demand.UrgentDemand``, fed by the worker) would keep more rows
running than the decode rows that fit the target, in such steps with the prompt tokens
interactive brings at its rate (``policies.owed_seats.urgent_backlogged``).
Then the engine's row cap and the drainer owe the lower tiers seats by weight for every
interactive row, not only for those past the cap: interactive asks more than the protected
batch gives, its TPOT promise broken by its own load, and the weights are the contract among
backlogged tiers. Never while the model is cold. Under its weight's share, interactive's own
load sets a target it fits (the alone step above), so only a load past the share (1.1x it in
seconds, or its rows past its share of the seats: ``TpotTarget``) is judged backlogged.
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
from gateway.worker.step_pricing import (
    LOWER_PREFILL_CHUNK,
    fitted_law,
    prefill_allowance,
    priced_cap,
    prompt_token_s,
    prompts_busy,
)
from gateway.worker.tpot_target import TpotTarget
from gateway.worker.urgent_demand import UrgentDemand
from policies.batch_bound import row_limit, rows_law
from policies.owed_seats import BACKLOG_ENTER, BACKLOG_EXIT, owed_seats, urgent_backlogged
from policies.step_cost import StepCostModel
from policies.tiers import (
    DEFAULT_TIER_SLOS,
    DEFAULT_TIER_WEIGHTS,
    INTERACTIVE,
    SMALL_BATCH_ROWS,
    TierSLO,
    tier_priority,
)
from policies.tpot_loop import ALONE_MAX_AGE_S, LOOP_STEPS_KEPT, LoopStep, enough, next_gain

log = logging.getLogger("carpool.worker")

REFIT_INTERVAL_S = 1.0
# A step's period is the time from the previous step's end to its own: its compute plus what
# the step thread waited between them (the GIL beside the event loop's HTTP, Redis and
# output work; the inbox), which every running row waits too. Only a step with a decode row
# has one (a step of prompts alone may follow an idle engine: bench sla's alone row, with
# the idle waits counted, set a 240 ms target beside a 99 ms served TPOT), and at most this
# much wait counts.
MAX_GAP_S = 0.25
# The loop steers the mean period interactive runs in to this share of its TPOT target, not
# to the target itself: a window's mean is +-15 % noise, and held at the target, bench sla's
# overload TPOT p50 landed 2 % and 7 % over it on a quiet machine; at 0.9 bulk goodput fell
# to 0.49-0.69 of its reach within the budget.
TPOT_AIM = 0.95
# Interactive decode steps whose rows' context prices its step alone (``urgent_kv_per_row``).
URGENT_CONTEXT_STEPS = 256
# Refit interval while the model is cold (fewer than min_samples steps): the per-row mean
# costs nothing to fit, and each step without a cap can cost interactive a whole prefill.
COLD_REFIT_INTERVAL_S = 0.1

class StepBudget:
    def __init__(self, engine: EngineClient, slo: TierSLO = DEFAULT_TIER_SLOS[INTERACTIVE],
                 urgent_priority: int = tier_priority(INTERACTIVE),
                 model: StepCostModel | None = None,
                 refit_interval_s: float = REFIT_INTERVAL_S,
                 tier_weights: Mapping[str, int] | None = None) -> None:
        self.engine = engine
        self.urgent_priority = urgent_priority
        # Seats under the cap follow the drain weights (by priority): the lower tiers share
        # theirs by weight, and with interactive's own weight they are owed seats in
        # proportion to its rows (``engine.core.row_cap``), so best-effort keeps its share
        # even when interactive alone would fill the cap.
        weights = DEFAULT_TIER_WEIGHTS if tier_weights is None else tier_weights
        self.seat_weights = {tier_priority(t): w for t, w in weights.items()}
        self.model = model or StepCostModel()
        share = self.seat_weights.get(urgent_priority, 0) / max(1, sum(self.seat_weights.values()))
        self._tpot = TpotTarget(slo, self.model, share)  # the target, and the steps it reads
        self.refit_interval_s = refit_interval_s
        # Steps seen on the step thread, not yet fed to the model (deque: thread-safe ends):
        # (rows, tokens, context tokens, seconds, prefill rows, interactive rows, period: from
        # the last step's end to this one's, what a row waits between its tokens,
        # interactive's decode rows and their context tokens)
        self._pending: deque[tuple[int, int, int, float, int, int, float, int, int]] = deque(
            maxlen=4096)
        # (decode rows, context tokens) of interactive's rows in the last steps that ran some
        self._urgent_context: deque[tuple[int, int]] = deque(maxlen=URGENT_CONTEXT_STEPS)
        self._last_step_end: float | None = None  # perf_counter at the last step observed
        self._remove: Callable[[], None] | None = None
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
        self.cap: int | None = None  # the row cap last set on the engine
        self.row_limit: int | None = None  # the batch bound for non-urgent rows (None: none)
        self.lower_ttft_s: float | None = None  # the tightest lower-tier TTFT target
        self._bound_said: int | None = None  # the bound last logged at info
        self.lower_prefill_tokens: int | None = None  # the allowance set with it
        # the fitted law for the tier status (operators; ``carpool bench sla`` prices its
        # reach with it): set where the model is fitted, read whole elsewhere
        self.law: dict[str, float] | None = None
        self.demand = UrgentDemand()  # what interactive asks (the worker feeds it)
        self.urgent_backlogged = False  # set with the cap: seats owed for every urgent row
        self.urgent_prompt_s = 0.0  # interactive's prompt tokens/s, read with its demand
        self.urgent_starts_s = 0.0  # and its requests started/s (a prefill row each)
        # interactive rows beside which the lower ones are priced (the worker counts its own)
        self.urgent_rows: Callable[[], int] = lambda: SMALL_BATCH_ROWS
        # and the lower tiers' requests it holds (on the event loop)
        self.lower_held: Callable[[], int] = lambda: 0
        self._state = self._snapshot()  # what ``state`` reads: taken again in ``_set``

    @property
    def slo(self) -> TierSLO:
        return self._tpot.slo

    @slo.setter
    def slo(self, slo: TierSLO) -> None:
        self._tpot.slo = slo

    @property
    def target_s(self) -> float | None:
        """The TPOT target in force (None: no data yet; ``gateway.worker.tpot_target``)."""
        return self._tpot.value

    @target_s.setter
    def target_s(self, value: float | None) -> None:
        self._tpot.value = value

    @property
    def last_alone_bias(self) -> float | None:
        return self._tpot.last_alone_bias

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
        urgent_decode = [s.start_pos + 1 for s in out.scheduled
                         if s.priority <= urgent and len(s.token_ids) == 1]
        now = time.perf_counter()
        last, self._last_step_end = self._last_step_end, now
        period = seconds  # a step of prompts only may follow an idle engine: no row waited
        if last is not None and prefill_rows < rows:
            period = max(seconds, min(now - last, seconds + MAX_GAP_S))
        self._pending.append((rows, tokens, kv_tokens, seconds, prefill_rows, urgent_rows,
                              period, len(urgent_decode), sum(urgent_decode)))

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
        return cap, self._prefill_allowance(cap, backlogged), backlogged

    def _backlogged(self, urgent_tokens_s: float | None, max_rows: int) -> bool:
        """Would interactive, asking ``urgent_tokens_s``, keep more rows running than the
        decode rows within the target, in such steps? Against those rows, not the cap in
        force: that one also prices lower-tier prompts, which interactive's rows do not
        bring (owing on it would judge interactive backlogged whenever lower prompts cost).
        Its own prompts count, at the model's cost per token: decode steps alone were 0.75 of
        the real ones (bench sla, 0.7x per tier: 51 ms modelled against 64-84 ms, 10-13
        interactive rows beside the target's 10, never judged backlogged). And whenever it
        is past its weight's share of each second (``TpotTarget.past_share``)."""
        assert self.target_s is not None  # set by plan
        if self._tpot.past_share:
            return True  # past its weight's share of each second (``TpotTarget``)
        margin = BACKLOG_EXIT if self.urgent_backlogged else BACKLOG_ENTER
        kv = self._urgent_kv()
        rows = self.model.max_rows_within(self.target_s, kv, limit=max_rows)
        return urgent_backlogged(urgent_tokens_s, rows, self.model.predict_decode(rows, kv),
                                 self.urgent_prompt_s, prompt_token_s(self.model), margin)

    def plan(self, max_rows: int, urgent_rows: int = SMALL_BATCH_ROWS,
             urgent_tokens_s: float | None = None) -> int | None:
        """Feed the pending steps to the model, refit and return the cap (None: no cap), the
        rows past ``urgent_rows`` priced with their prompts, the derived target no shorter
        than interactive's step alone at ``urgent_tokens_s`` (``TpotTarget.derive``). Touches
        only the model and the pending steps: safe off the event loop."""
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
        self.law = None if self.cold else fitted_law(self.model)
        target = self._tpot.derive(urgent_tokens_s, max_rows, self._urgent_prompts_busy(),
                                   self._urgent_kv())
        self._steer(window, target * TPOT_AIM)
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
            cap = priced_cap(self.model, cap, target, urgent_rows, self._urgent_prompts_busy())
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
        """Feed the pending steps to the model (their compute seconds: what the step's shape
        costs) and the measured steps (the small decode step, interactive alone) and the
        loop's window (their periods: what a row waits between tokens, the TPOT a client
        sees); returns the window."""
        pending, window, now = self._pending, [], self.clock()
        while pending:
            (rows, tokens, kv_tokens, seconds, prefill_rows, urgent, period, urgent_decode,
             urgent_kv) = pending.popleft()
            self.model.observe(rows, tokens, kv_tokens, seconds, prefill_rows)
            if urgent_decode:
                self._urgent_context.append((urgent_decode, urgent_kv))
            if not prefill_rows and rows == SMALL_BATCH_ROWS:
                self._tpot.small_steps.append(period)
            if urgent == rows and self._lower_held == (0, 0):
                self._tpot.alone_steps.append((now, rows, tokens, kv_tokens, prefill_rows,
                                               period))
            window.append(LoopStep(period, rows, urgent))
        # aged only while new ones can come: under a sustained overload the last steps alone
        # stay the measure of the law (else, 120 s in, the bias lapsed and the target went
        # back to the law refit on bulk steps)
        alone = self._tpot.alone_steps
        while self._lower_held == (0, 0) and alone and alone[0][0] < now - ALONE_MAX_AGE_S:
            alone.popleft()
        return window

    @property
    def state(self) -> dict[str, Any]:
        """What the budget decided last, for the tier status (operators): the row cap set on
        the engine (None: none), the TPOT target in force and the gain the cap is priced at
        (``target_s x gain = cap_target_s``), ``alone_bias`` (interactive's measured steps
        alone against the law, which the target's law is scaled by; None when not
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

    def urgent_kv_per_row(self) -> float | None:
        """Context tokens per interactive decode row over its last steps (None: none seen)."""
        rows = sum(r for r, _ in self._urgent_context)
        return sum(kv for _, kv in self._urgent_context) / rows if rows else None

    def _urgent_kv(self) -> float:
        """Interactive's context per decode row, or every row's before any was seen."""
        kv = self.urgent_kv_per_row()
        return self.model.mean_kv_per_row() if kv is None else kv

    def _urgent_prompts_busy(self) -> float:
        return prompts_busy(self.model, self.urgent_prompt_s, self.urgent_starts_s)

    def _prefill_allowance(self, cap: int | None, backlogged: bool = False) -> int | None:
        return prefill_allowance(self.model, cap, self.cap_target_s, self.cold, backlogged)

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
                                           lower_prefill_tokens, backlogged, LOWER_PREFILL_CHUNK)
            log.debug("urgent row cap %s, lower prefill %s tokens, interactive backlogged %s "
                      "(target %s s, priced at x%.2f)", cap, lower_prefill_tokens, backlogged,
                      self.target_s, self.gain)
            self.cap, self.lower_prefill_tokens, self.urgent_backlogged = now
        self._state = self._snapshot()
        return cap
