"""Admission for ``Scheduler``: phases 2 and 3 of ``schedule()``, which start swapped requests
again (swap-in) and then waiting ones, in (priority, arrival) order. Torch-free.

A waiting request starts when the batching admission policy (``policies.batching``) lets one
more in, a seat is free (``max_num_seqs``), its blocks fit (after the prefix cache's share)
and the token budget has room for its first chunk. A request blocked by blocks or by seats
preempts running requests of strictly lower priority (``_preempt_lower``), if that can make
room; a blocked swapped request stops phase 2 and lets only strictly more urgent waiting
requests start; a blocked waiting request stops phase 3 (FCFS within a priority). Under an
urgent row cap (``engine.core.row_cap``) a request starts only into its priority's seats and
its prompt only within its priority's prefill allowance.

A mixin: it works on the scheduler's own state, declared below; ``Scheduler`` runs the phases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.core.block_manager import BlockManager
from engine.core.config import SchedulerConfig
from engine.core.request import Request
from engine.core.request_queue import RequestQueue
from engine.core.row_cap import StepRowCap
from engine.core.step_plan import StepPlan
from policies.batching import AdmissionPolicy, AdmissionSnapshot

_OK, _NO_BUDGET, _NO_ROOM = "ok", "budget", "room"


class AdmissionMixin:
    config: SchedulerConfig
    block_manager: BlockManager
    clock: Callable[[], float]
    running: dict[str, Request]  # admission order
    waiting: RequestQueue
    swapped: RequestQueue
    _admission: AdmissionPolicy  # how many waiting requests may start this step
    _batch_filling: bool
    _step_cap: StepRowCap | None

    if TYPE_CHECKING:  # the scheduler's and the other mixins' (runtime: theirs, by the MRO)
        def _chunk(self, req: Request, computed: int, budget: int) -> int: ...
        def _fail_if_outgrown(self, req: Request, num_tokens: int) -> bool: ...
        def _start_running(self, req: Request, num_new: int, plan: StepPlan) -> None: ...
        def _free_parked(self, ahead: Request, need_blocks: int) -> bool: ...
        def _preempt_lower(self, priority: int, need_blocks: int, plan: StepPlan) -> bool: ...

    def _schedule_swapped(self, plan: StepPlan) -> None:
        bm = self.block_manager
        for req in self.swapped:
            if self._past_row_cap(req, plan):
                continue  # its priority's seats under the cap are taken; others may have some
            if self._fail_if_outgrown(req, req.num_tokens):
                continue
            num_new = self._chunk(req, req.num_computed_tokens,
                                  self._token_budget(req, req.num_computed_tokens, plan))
            need = max(
                bm.num_cpu_blocks_of(req.request_id),
                bm.blocks_needed(req.num_computed_tokens + num_new),
            )
            while num_new and not (
                len(self.running) < self.config.max_num_seqs and bm.num_free_blocks >= need
            ):
                if not (self._free_parked_for_blocks(req, need)
                        or self._preempt_lower(req.priority, need, plan)):
                    num_new = 0
            if not num_new:
                plan.blocked_priority = req.priority
                return
            mapping = bm.swap_in(req.request_id)
            grown = bm.allocate_slots(req.request_id, num_new, req.num_computed_tokens)
            assert mapping is not None and grown  # room was checked above
            plan.swap_in.extend(mapping)
            plan.swapped_in.add(req.request_id)
            self.swapped.remove(req.request_id)
            self._start_running(req, num_new, plan)

    def _schedule_waiting(self, plan: StepPlan) -> None:
        limit = self._admission(self._admission_snapshot())
        admitted, reason = 0, "empty"
        for req in self.waiting:
            if plan.blocked_priority is not None and req.priority >= plan.blocked_priority:
                reason = "swapped"
                break  # a blocked swapped request goes first unless this one is more urgent
            if req.request_id in plan.preempted or admitted >= limit:
                reason = "limit"
                break
            if self._no_prompt_tokens_left(req, plan):
                reason = "limit"
                continue  # its priority's prefill allowance is spent; another's may not be
            if self._past_row_cap(req, plan):
                reason = "limit"
                continue  # the cap counts seats per priority: a lower one may have some
            if self._fail_if_outgrown(req, req.num_tokens):
                continue
            reason = self._admit(req, plan)
            if reason != _OK:
                break
            admitted += 1
        # A batch cut short only by the token budget keeps filling on the next steps.
        started = limit > 0 and admitted > 0
        self._batch_filling = reason == _NO_BUDGET and (started or self._batch_filling)

    def _admit(self, req: Request, plan: StepPlan) -> str:
        """Try to start one waiting request; returns _OK, _NO_BUDGET or _NO_ROOM."""
        bm = self.block_manager
        tokens = req.all_token_ids
        # a forked sequence (n > 1) already holds its shared prompt blocks
        forked = bm.num_device_blocks_of(req.request_id) > 0
        computed = req.num_computed_tokens if forked else bm.match_prefix(tokens)
        num_new = self._chunk(req, computed, self._token_budget(req, computed, plan))
        if not num_new:
            return _NO_BUDGET
        fresh = bm.blocks_needed(computed + num_new) - computed // bm.block_size
        while not (
            len(self.running) < self.config.max_num_seqs
            and bm.allocate_slots(req.request_id, num_new, computed, tokens)
        ):
            if not (self._free_parked_for_blocks(req, fresh)
                    or self._preempt_lower(req.priority, fresh, plan)):
                return _NO_ROOM
        self.waiting.remove(req.request_id)
        req.num_computed_tokens = computed
        if req.times.first_scheduled is None:  # usage's cached_tokens: the first admission
            req.num_cached_tokens = computed
        self._start_running(req, num_new, plan)
        return _OK

    def _free_parked_for_blocks(self, req: Request, need_blocks: int) -> bool:
        """``_free_parked`` for a request with a seat (blocks cannot give it one: no work
        is dropped for nothing), before any running work is preempted for it."""
        return (len(self.running) < self.config.max_num_seqs
                and self._free_parked(req, need_blocks))

    def _token_budget(self, req: Request, computed: int, plan: StepPlan) -> int:
        """The step's token budget left for ``req`` (``computed`` tokens cached or done),
        bounded by the cap's prefill allowance."""
        cap = self._step_cap
        if cap is None:
            return plan.budget
        return cap.token_budget(req, plan.budget, req.num_tokens - computed)

    def _no_prompt_tokens_left(self, req: Request, plan: StepPlan) -> bool:
        """The cap's prefill allowance for ``req``'s priority is spent this step (asked
        before the request takes a seat)."""
        cap = self._step_cap
        return (cap is not None and plan.budget > 0
                and cap.token_budget(req, plan.budget, req.num_tokens) <= 0)

    def _past_row_cap(self, req: Request, plan: StepPlan) -> bool:
        """The urgent row cap keeps swapped or waiting ``req`` from starting this step (asked
        once per request about to start: a yes takes its priority's seat)."""
        cap = self._step_cap
        return cap is not None and not cap.take_seat(req)

    def _admission_snapshot(self) -> AdmissionSnapshot:
        return AdmissionSnapshot(
            now=self.clock(),
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            oldest_waiting_arrival=self.waiting.oldest_arrival(),
            max_num_seqs=self.config.max_num_seqs,
            max_wait_ms=self.config.max_wait_ms,
            batch_filling=self._batch_filling,
        )
