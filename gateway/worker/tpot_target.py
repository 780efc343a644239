"""The interactive TPOT target the step budget (``gateway.worker.step_budget``) prices its row
cap to: the tier's ``TierSLO.tpot_p99_s`` or, when unset, ``policies.tiers.derived_tpot_target``
of the small-batch step: measured (the median of the decode steps of that many rows seen,
``policies.tiers.measured_small_step``), predicted by the step-cost model until enough were
seen; or of interactive's step alone at the rate it asks, when that is longer (``derive``).

Interactive's step alone is the law's figure (``policies.tiers.alone_step``), the law scaled
by what its recent steps alone (interactive rows only, while the worker held no lower-tier
request) measured against it (``policies.tpot_loop.alone_bias``), up or down. Why: the law's
base moved 31.8 -> 47.8 ms between two bench sla runs, whose overload TPOTs were 1.25x and 1.82x alone; in a third
the law put interactive's step alone 15 % short, the cap left the lower tiers nothing, and bulk
got 0.09 of FCFS.

Not thread-safe: ``derive`` runs where the budget plans (off the event loop), the steps are
appended where the budget feeds its model, both from the budget's ``plan``.
"""

from __future__ import annotations

import logging
from collections import deque

from policies.step_cost import StepCostModel
from policies.tiers import (
    SMALL_BATCH_ROWS,
    SMALL_STEPS_KEPT,
    TierSLO,
    alone_step,
    derived_tpot_target,
    measured_small_step,
    rows_past_seats,
)
from policies.tpot_loop import ALONE_STEPS_KEPT, alone_bias

log = logging.getLogger("carpool.worker")

# The derived target is logged again when it moved this share since last said. Why: it was
# said once, at the first warm fit, which comes in the start's prompt-heavy steps (bench sla:
# 71 ms from a predicted 55 ms 4-row step, during the calibration), so a server log could not
# tell which target a measured TPOT ratio was held to.
TARGET_LOG_STEP = 0.1
# Interactive, once its rows passed its weight's share of the seats, counts as under it again
# only below this fraction of the share (``_alone_step``).
SHARE_HYSTERESIS = 0.9
# Past its share of each second by this much, interactive is past it (the weights decide: the
# small step's target, and seats owed); back under it only below PAST_SHARE_EXIT. In between,
# its target is the step at its share (``policies.tiers.alone_step``). Why 1.1
# and not 1.25: a load at 1x capacity asks ~0.7-0.9 of each second by the law (the base is
# shared), so 0.75 was barely past, and bench sla's backlog row left best-effort 0.39 of its
# WRR share in two runs (0.73-0.75 when past at the share itself).
PAST_SHARE_ENTER = 1.1
PAST_SHARE_EXIT = 1.0

# (when fed, rows, tokens, context tokens, prefill rows, seconds) of a step interactive ran alone
AloneStep = tuple[float, int, int, int, int, float]


class TpotTarget:
    def __init__(self, slo: TierSLO, model: StepCostModel, share: float) -> None:
        self.slo = slo
        self.model = model
        self.share = share  # interactive's weight over all the tiers' weights
        # seconds of the last decode-only steps of SMALL_BATCH_ROWS rows (the derived target's
        # reference, ``policies.tiers.measured_small_step``)
        self.small_steps: deque[float] = deque(maxlen=SMALL_STEPS_KEPT)
        # the last steps that ran interactive rows only while the lower tiers held nothing:
        # its step alone, measured, against which the law is checked
        self.alone_steps: deque[AloneStep] = deque(maxlen=ALONE_STEPS_KEPT)
        self.value: float | None = None  # the TPOT target in force (None: no data yet)
        self.last_alone_bias: float | None = None  # the last measured alone bias
        self._over_share = False  # interactive's rows passed its share of the seats
        self.past_share = False  # it asks PAST_SHARE_ENTER x its share of each second
        # the share of each second interactive's rows and prompts ask (the law scaled by its
        # alone bias), at the last derive; None: not known (configured target, cold, no demand)
        self.asked_share: float | None = None
        self._said: float | None = None  # the target last logged at info
        self._source_said: str | None = None  # and what it was derived from

    @property
    def cold(self) -> bool:
        return self.model.num_samples < self.model.min_samples

    def derive(self, urgent_tokens_s: float | None, max_rows: int, prompts_busy: float,
               kv_per_row: float | None = None) -> float:
        """The TPOT target in force: the configured one, else ``derived_tpot_target`` of the
        small-batch step or, when longer, of the step interactive's own load runs in alone
        (``_alone_step``; ``prompts_busy``: the share of each second its prompts take). Why
        the latter: the promise is TPOT within 1.3x of interactive *alone*, and its load alone
        may run more rows than the small batch; on the AVX-512 Xeon (step ~ 34 ms + 3.5 ms a
        row) bench sla's 0.5x-capacity interactive ran 7 rows at 72 ms TPOT against a 59 ms
        target from the 4-row step, so the budget judged it backlogged, owed the lower tiers
        seats for every interactive row and TPOT went to 1.34-1.59x alone."""
        follows_demand = False
        if self.slo.tpot_p99_s is not None:
            self._forget_share()
            target, how = self.slo.tpot_p99_s, "configured"
        else:
            measured = measured_small_step(self.small_steps)
            if measured is not None:
                small = measured
                how = (f"derived from the measured {SMALL_BATCH_ROWS}-row step, "
                       f"{small * 1000:.0f} ms, median of {len(self.small_steps)}")
            else:
                small = self.model.predict_decode(SMALL_BATCH_ROWS, self.model.mean_kv_per_row())
                how = (f"derived from the predicted {SMALL_BATCH_ROWS}-row step, "
                       f"{small * 1000:.0f} ms")
            target = derived_tpot_target(small, self.slo.tpot_budget_x)
            bias = self._alone_bias(measured) if urgent_tokens_s and not self.cold else None
            self.last_alone_bias = bias
            alone = self._alone_step(urgent_tokens_s, max_rows, measured, prompts_busy,
                                     kv_per_row, bias or 1.0)
            basis = f"at its {urgent_tokens_s or 0:.0f} tokens/s"
            if bias is not None:
                basis += (f", the law x{bias:.2f} as its {len(self.alone_steps)} steps "
                          f"alone measured")
            if alone is not None and derived_tpot_target(alone, self.slo.tpot_budget_x) > target:
                target = derived_tpot_target(alone, self.slo.tpot_budget_x)
                how = f"derived from interactive's step alone, {alone * 1000:.0f} ms {basis}"
                follows_demand = True
        self._say(target, how, follows_demand)
        self.value = target
        return target

    def _say(self, target: float, how: str, follows_demand: bool) -> None:
        """Log the target in force at info when first chosen, when what it is derived from
        changed (``how`` up to its first comma) and when it moved TARGET_LOG_STEP since last
        said; but a target that ``follows_demand`` (interactive's step alone, which moves with
        a demand that is +-20 % between refits) logs its moves at debug. A cold model's
        target is provisional: not said."""
        if self.cold:
            return
        source, said = how.split(",")[0], self._said
        moved = said is None or abs(target - said) >= said * TARGET_LOG_STEP
        if source != self._source_said or (moved and not follows_demand):
            self._said, self._source_said = target, source
            log.info("interactive TPOT target %.0f ms (%s)", target * 1000, how)
        elif moved:
            log.debug("interactive TPOT target %.0f ms (%s)", target * 1000, how)

    def _alone_step(self, urgent_tokens_s: float | None, max_rows: int,
                    measured: float | None, prompts_busy: float,
                    kv_per_row: float | None = None, bias: float = 1.0) -> float | None:
        """The mean step interactive, asking ``urgent_tokens_s`` decode tokens a second with
        its prompts at their rate, would run in alone on ``max_rows`` seats
        (``policies.tiers.alone_step``), its rows at their own context (``kv_per_row``;
        None: the mean of every row's) and the law scaled by ``bias`` (what its steps alone
        measured against it). Past its weight's share of each second, the step at that share,
        continuous in the demand: bench sla's
        interactive at 0.5x capacity asks about its share, its demand is ~25 starts in a 10 s
        window (+-20 %), and each crossing to the small step's target moved the target and the
        cap (82 to 60 ms; seats owed; TPOT 1.26x its budget). None while cold, with no demand
        known, ``past_share`` (PAST_SHARE_ENTER x its share, until under PAST_SHARE_EXIT x),
        or when its rows pass the share of the seats (under ``SHARE_HYSTERESIS`` of it to
        count as under again): then backlogged, the weights decide, not its TPOT."""
        if self.cold or not urgent_tokens_s:
            self._forget_share()
            return None
        model = self.model
        # interactive's own context, not the mean row's: under overload the bulk's longer
        # contexts priced its rows, and its step alone, up with them
        kv = model.mean_kv_per_row() if kv_per_row is None else kv_per_row
        marginal = model.decode_row_cost(kv)
        # the base through the measured small step where there is one (``measured``): the
        # fit's own split of base and per-row cost moves between refits and servers (34-60 ms
        # bases on one machine; a 41 ms one put interactive's step alone at 75 ms against a
        # measured 56 ms TPOT alone), the small step and the slope far less
        alone = alone_step(bias * self._alone_base(measured), bias * marginal, urgent_tokens_s,
                           bias * prompts_busy, self.share)
        # its rows against its share of the seats: past it, none; once past, under
        # SHARE_HYSTERESIS of it to count as under again
        seats = max_rows * (SHARE_HYSTERESIS if self._over_share else 1.0)
        self._over_share = alone is not None and rows_past_seats(urgent_tokens_s, alone,
                                                                 self.share, seats)
        alone = None if self._over_share else alone
        asked = self.asked_share = bias * (prompts_busy + marginal * urgent_tokens_s)
        margin = PAST_SHARE_EXIT if self.past_share else PAST_SHARE_ENTER
        self.past_share = asked >= margin * self.share
        return None if self.past_share else alone

    def _forget_share(self) -> None:
        """No demand judged (a configured target, a cold model, no demand known): no share
        asked, and none of its hystereses held."""
        self.asked_share, self.past_share, self._over_share = None, False, False

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
                           for _, rows, tokens, kv, prefill_rows, seconds in self.alone_steps])
