"""Token-level continuous-batching scheduler over the paged KV block manager. Torch-free.

One step is ``out = schedule()``, the runner executes ``out`` (swap-outs, block copies,
swap-ins, forward), then ``update_from_output(out, result)``. Progress is one counter per
request: ``num_computed_tokens`` catches up to ``num_tokens``; a chunk that reaches the end
samples.

``schedule()`` runs named phases:

1. ``_schedule_running``: every running request gets one decode token or its next prefill
   chunk under the token budget. If its blocks cannot grow, a victim chosen by
   ``policies.preemption.choose_victim`` is preempted (possibly itself), in
   ``preemption_mode`` (swap falls back to recompute when the CPU pool is full).
2. ``_schedule_swapped``: swapped requests resume (swap-in) in (priority, arrival) order.
3. ``_schedule_waiting``: waiting requests start in (priority, arrival) order, capped by the
   batching admission policy, ``max_num_seqs``, free blocks and the token budget (a prompt
   longer than the remaining budget is chunked).
   In 2 and 3 a request blocked by blocks or by ``max_num_seqs`` preempts running requests of
   strictly lower priority (never equal), if that can make room. A blocked swapped request
   stops phase 2 and lets only strictly more urgent waiting requests start in phase 3; a
   blocked waiting request stops phase 3 (FCFS within a priority).
Phases 2-3 are skipped in a step where phase 1 had to preempt (memory is short).
With an urgent row cap set (``set_urgent_row_cap``, see ``engine.core.row_cap``) and urgent
work present, phase 1 skips the running rows held back this step and phases 2-3 start no
lower-priority request past the cap; lower-priority prompts are chunked to the cap's prefill
allowance (``StepRowCap.token_budget``). With no urgent work present, a request marked
``first_token_urgent`` makes the step computing its first token capped the same way.
Failures never hang: a prompt that can never fit finishes in ``add_request``, and a request
whose prompt + output outgrows the whole cache finishes, both with FINISHED_ERROR.

Phases 2 and 3 live in ``engine.core.admission``; the eviction mechanism (swap or recompute,
victims of lower priority, ``preempt_request``) in ``engine.core.preemption``; an n > 1
request's sequences fork after its prompt is computed, sharing its blocks
(``engine.core.parallel_sampling``). Not thread-safe: call
everything from the engine's step thread, never between ``schedule()`` and the runner's
execution of its output.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from engine.core.admission import AdmissionMixin
from engine.core.block_manager import BlockManager
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.parallel_sampling import ForkGroup, ForkMixin
from engine.core.preemption import PreemptionMixin
from engine.core.request import Request, RequestStatus
from engine.core.request_checks import never_fits_reason, outgrown_reason, stop_status
from engine.core.request_queue import RequestQueue
from engine.core.row_cap import PrefillCredit, RowCap, StepRowCap, plan_step
from engine.core.stats import SchedulerCounters, SchedulerStats
from engine.core.step_plan import StepPlan
from policies.batching import get_admission_policy, padding_rows
from policies.preemption import choose_victim


class Scheduler(AdmissionMixin, PreemptionMixin, ForkMixin):
    def __init__(
        self,
        config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        num_cpu_blocks: int,
        max_model_len: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cache_config = cache_config
        self.max_model_len = max_model_len
        self.clock = clock
        self.block_manager = BlockManager(
            num_blocks, cache_config.block_size, num_cpu_blocks, cache_config.enable_prefix_caching
        )
        self._admission = get_admission_policy(config.batching)
        self._requests: dict[str, Request] = {}
        self.waiting = RequestQueue()
        self.swapped = RequestQueue()
        self.running: dict[str, Request] = {}  # admission order
        self._to_return: dict[str, Request] = {}  # finished between updates (abort, error)
        self._finished_ids: list[str] = []  # for the next SchedulerOutput
        self._batch_filling = False
        self._batch_seats = 0  # members the current batch started with (fixed-shape modes)
        self._between_steps = StepPlan(budget=0)  # preemptions made outside schedule()
        self._counts = SchedulerCounters()
        self._row_cap: RowCap | None = None  # runtime knob: set_urgent_row_cap
        self._row_cap_scores: dict[int, int] = {}  # its weighted round-robin, across steps
        self._prefill_credit = PrefillCredit()  # its lower prompt tokens banked, across steps
        self._step_cap: StepRowCap | None = None  # how it applies to the step being built
        self._groups: dict[str, ForkGroup] = {}  # n > 1 requests (engine.core.parallel_sampling)
        self._parent_of: dict[str, str] = {}

    # ---- public API -------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; one that can never fit finishes at once with FINISHED_ERROR."""
        rid = request.request_id
        if rid in self._requests:
            raise ValueError(f"duplicate request id {rid!r}")
        self._requests[rid] = request
        if request.sampling_params.n > 1:
            self._register_group(request)
        bm = self.block_manager
        error = never_fits_reason(request, bm.num_blocks, bm.block_size, self.max_model_len, self.config)
        if error is not None:
            self._finish(request, RequestStatus.FINISHED_ERROR, error)
            return
        request.status = RequestStatus.WAITING
        self.waiting.add(request)

    def abort_request(self, request_id: str) -> None:
        """Abort in any state; frees device and CPU blocks now. Unknown/finished id: no-op.

        The tokens produced so far stay on the request, which the next
        ``update_from_output`` returns (finish reason "abort"). An n > 1 request's id aborts
        all its sequences.
        """
        self._abort_group(request_id)
        req = self._requests.get(request_id)
        if req is None or req.is_finished:
            return
        self._counts.aborts += 1
        self._drop_pending_swap_out(request_id)
        self._finish(req, RequestStatus.FINISHED_ABORTED)

    def finish_request(self, request_id: str, status: RequestStatus) -> None:
        """Finish a request the caller decided is done (stop strings); frees its blocks.

        The caller already handles its output, so it is *not* returned again by
        ``update_from_output``; it is forgotten at once. Unknown/finished id: no-op.
        """
        if not status.is_finished:
            raise ValueError(f"{status.name} is not a finished status")
        req = self._requests.get(request_id)
        if req is None or req.is_finished:
            return
        self._drop_pending_swap_out(request_id)
        self._finish(req, status, returned=False)
        self._requests.pop(request_id, None)

    def set_urgent_row_cap(self, cap: int | None, urgent_priority: int = 0,
                           weights: Mapping[int, int] | None = None,
                           lower_prefill_tokens: int | None = None,
                           urgent_backlogged: bool = False,
                           lower_prefill_chunk: int = 1) -> None:
        """While a request of priority <= ``urgent_priority`` is present, schedule at most
        ``cap`` rows a step (urgent ones first, the lower seats shared by ``weights``:
        priority -> weight) and at most ``lower_prefill_tokens`` lower-priority prompt tokens
        (only with chunked prefill: unchunked prompts would never fit); None lifts the cap.
        ``urgent_backlogged``: seats are owed for every urgent row. The allowance is an
        average: released in chunks of at least ``lower_prefill_chunk`` tokens. See
        ``engine.core.row_cap``."""
        if not self.config.enable_chunked_prefill:
            lower_prefill_tokens = None
        self._row_cap = None if cap is None else RowCap(
            cap, urgent_priority, dict(weights or {}), lower_prefill_tokens, urgent_backlogged,
            lower_prefill_chunk)

    @property
    def urgent_row_cap(self) -> RowCap | None:
        return self._row_cap

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self._to_return)

    @property
    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_swapped=len(self.swapped),
            lowest_running_priority=max((r.priority for r in self.running.values()), default=None),
            waiting_by_priority=self.waiting.by_priority(),
            urgent_row_cap=None if self._row_cap is None else self._row_cap.cap,
            swapped_by_priority=self.swapped.by_priority(),
            device_blocks_total=bm.num_blocks,
            device_blocks_used=bm.num_used_blocks,
            device_blocks_free=bm.num_free_blocks,
            cpu_blocks_total=bm.num_cpu_blocks,
            cpu_blocks_used=bm.num_used_cpu_blocks,
            prefix_cache_queries=bm.prefix_query_tokens,
            prefix_cache_hits=bm.prefix_hit_tokens,
            **dataclasses.asdict(self._counts),
        )

    # ---- schedule ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.block_manager.begin_step()
        plan = StepPlan(budget=self.config.max_num_batched_tokens)
        carried, self._between_steps = self._between_steps, StepPlan(budget=0)
        plan.swap_out.extend(carried.swap_out)
        plan.preempted_ids.extend(carried.preempted_ids)
        plan.swapped_out.update(carried.swapped_out)
        if not self.running:
            self._batch_seats = 0  # the last batch is over
        self._step_cap = None
        if self._row_cap is not None:
            self._step_cap = plan_step(self._row_cap, self.running.values(), self.waiting,
                                       self.swapped, self._row_cap_scores,
                                       self.config.max_num_seqs - len(self.running),
                                       self._prefill_credit)
        self._schedule_running(plan)
        if not plan.memory_preempted:
            self._schedule_swapped(plan)
            self._schedule_waiting(plan)
        if self._step_cap is not None:
            self._prefill_credit.spend(self._step_cap.prefill_spent())
        self._batch_seats = max(self._batch_seats, len(self.running))
        out = plan.to_output(self._finished_ids, self.block_manager.take_copies())
        mode, seats = self.config.batching, self._batch_seats
        out.num_padding_rows = padding_rows(mode, seats, len(self.running))
        self._finished_ids = []
        self._counts.num_steps += 1
        self._counts.num_scheduled_tokens = self.config.max_num_batched_tokens - plan.budget
        self._counts.num_scheduled_requests = len(plan.scheduled)
        return out

    def _schedule_running(self, plan: StepPlan) -> None:
        running = RequestStatus.RUNNING
        reqs = list(self.running.values())
        cap = self._step_cap
        if cap is not None and cap.held:
            held = cap.held
            reqs = [r for r in reqs if r.request_id not in held]
            self._counts.rows_held_back += len(held)
        table_covering, step = self.block_manager.table_covering, self._counts.num_steps
        add_decode = plan.add_decode
        for req in reqs:
            budget = plan.budget
            if budget <= 0:
                break
            if req.status != running:
                continue  # preempted or failed earlier in this step
            # The common case inline: this loop is the per-step hot path (256+ decodes).
            computed = req.num_computed_tokens
            num_new = len(req.prompt_token_ids) + len(req.output_token_ids) - computed
            if num_new == 1:  # a decode row inside its last block: nothing to grow or spend
                table = table_covering(req.request_id, computed + 1)
                if table is not None:  # (a running request was scheduled before: its
                    add_decode(req, table)  # first_scheduled time is set)
                    req.last_scheduled_step = step
                    continue
            if num_new > 1 and cap is not None:  # a prompt chunk under the cap's allowance
                budget = cap.token_budget(req, budget, num_new)
            if num_new > budget:
                num_new = self._chunk(req, req.num_computed_tokens, budget)
                if not num_new:
                    continue
            if self._grow_or_preempt(req, num_new, plan):
                self._add_scheduled(req, num_new, plan)

    def _grow_or_preempt(self, req: Request, num_new: int, plan: StepPlan) -> bool:
        bm = self.block_manager
        while not bm.allocate_slots(req.request_id, num_new, req.num_computed_tokens):
            if self._fail_if_outgrown(req, req.num_computed_tokens + num_new):
                return False
            grow = bm.blocks_needed(req.num_computed_tokens + num_new)
            if self._free_parked(req, grow - bm.num_device_blocks_of(req.request_id)):
                continue  # a parked fork's blocks before running work
            plan.memory_preempted = True
            victim_id = choose_victim(self._candidates(lambda r: True, plan))
            assert victim_id is not None  # req itself is always a candidate
            self._preempt(self.running[victim_id], plan)
            if victim_id == req.request_id:
                return False
        return True

    # ---- mechanism --------------------------------------------------------------------
    def _chunk(self, req: Request, computed: int, budget: int) -> int:
        """Tokens to compute now: all remaining, or a chunk of the budget, or 0 (wait).

        Without chunked prefill a chunk is still cut when the remainder could never fit in
        one step (a preempted request re-prefilling prompt + output): else it would hang.
        """
        remaining = req.num_tokens - computed
        if remaining <= budget:
            return remaining
        if self.config.enable_chunked_prefill or remaining > self.config.max_num_batched_tokens:
            return max(budget, 0)
        return 0

    def _fail_if_outgrown(self, req: Request, num_tokens: int) -> bool:
        """Finish with FINISHED_ERROR a request whose KV can no longer fit the whole cache
        (else, as the only running request, or after a preemption, it would hang)."""
        bm = self.block_manager
        error = outgrown_reason(num_tokens, bm.num_blocks, bm.block_size)
        if error is not None:
            self._finish(req, RequestStatus.FINISHED_ERROR, error)
        return error is not None

    def _start_running(self, req: Request, num_new: int, plan: StepPlan) -> None:
        req.status = RequestStatus.RUNNING
        self.running[req.request_id] = req
        self._add_scheduled(req, num_new, plan)

    def _add_scheduled(self, req: Request, num_new: int, plan: StepPlan) -> None:
        plan.add(req, num_new, self.block_manager.get_block_ids(req.request_id))
        req.last_scheduled_step = self._counts.num_steps
        if self._step_cap is not None:  # a lower prompt chunk uses the cap's allowance
            self._step_cap.spend(req.priority, num_new)
        if req.times.first_scheduled is None:
            req.times.first_scheduled = self.clock()
            req.times.first_scheduled_step = self._counts.num_steps + 1  # counted at the end

    def _finish(
        self, req: Request, status: RequestStatus, error: str | None = None, returned: bool = True
    ) -> None:
        rid = req.request_id
        self.running.pop(rid, None)
        self.waiting.remove(rid)
        self.swapped.remove(rid)
        self.block_manager.free(rid)
        req.status = status
        if error is not None:
            req.error = error
            self._counts.errors += 1
        req.times.finished = self.clock()
        self._counts.finished += 1
        self._finished_ids.append(rid)
        if returned:
            self._to_return[rid] = req
        if self._groups:
            self._group_member_finished(req, returned)

    # ---- update -----------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Apply a step's results; return every request that got a token or finished since
        the last update (aborts and errors between steps included)."""
        changed = self._to_return
        self._to_return = {}
        bm = self.block_manager
        block_size = bm.block_size
        caching = bm.enable_prefix_caching
        # the per-row loop is the update's hot path (256+ decodes a step): locals, not lookups
        requests_get, running, max_model_len = self._requests.get, RequestStatus.RUNNING, \
            self.max_model_len
        sampled, logprobs, groups = result.sampled, result.logprobs, self._groups
        for sched in out.scheduled:
            rid = sched.request_id
            req = requests_get(rid)
            if req is None or req.status != running:
                continue  # aborted/finished after schedule(): dropped at the step boundary
            start = sched.start_pos
            computed = start + len(sched.token_ids)
            req.num_computed_tokens = computed
            # a block filled up this step (the hashes cover every full block before it, so a
            # decode token inside a block has nothing to hash: the hot path skips the lookup)
            if (caching and computed // block_size > start // block_size
                    and computed // block_size > bm.num_cached_blocks_of(rid)):
                bm.cache_blocks(rid, req.all_token_ids, computed)
            if not sched.sample:
                continue
            try:
                token = sampled[rid]
            except KeyError:
                raise KeyError(f"runner returned no sampled token for {rid!r}") from None
            output = req.output_token_ids
            output.append(token)
            if logprobs and rid in logprobs:
                req.output_logprobs.append(logprobs[rid])
            if groups and len(output) == 1:
                self._fork_children(req)  # n > 1: the prompt is computed, the others start
            if req.times.first_token is None:
                req.times.first_token = self.clock()
                req.times.first_token_step = self._counts.num_steps
            changed[rid] = req
            status = stop_status(req, token, max_model_len)
            if status is not None:
                self._finish(req, status, returned=False)
        for rid, req in changed.items():
            if req.status > RequestStatus.PREEMPTED:  # finished (``is_finished``, inlined)
                self._requests.pop(rid, None)
        return list(changed.values())
