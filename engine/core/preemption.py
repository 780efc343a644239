"""Preemption for ``Scheduler``: evicting running requests (swap to the CPU pool, or drop
the KV to recompute later), choosing victims among those of strictly lower priority, and
preempting on request between steps. Torch-free.

A mixin: it works on the scheduler's own state (``running``/``waiting``/``swapped``, the block
manager, counters, the plan of the step being built), declared below; ``Scheduler`` runs the
phases that decide *when* to preempt. Victims are picked by ``policies.preemption``.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.block_manager import BlockManager
from engine.core.config import PreemptionMode, SchedulerConfig
from engine.core.request import Request, RequestStatus
from engine.core.request_queue import RequestQueue
from engine.core.stats import SchedulerCounters
from engine.core.step_plan import StepPlan
from policies.preemption import VictimCandidate, choose_victim, may_preempt_for


class PreemptionMixin:
    config: SchedulerConfig
    block_manager: BlockManager
    running: dict[str, Request]  # admission order
    waiting: RequestQueue
    swapped: RequestQueue
    _counts: SchedulerCounters
    _between_steps: StepPlan  # preemptions made outside schedule()

    def _drop_pending_swap_out(self, request_id: str) -> None:
        # A swap-out decided between steps has not been copied yet; once the request is gone
        # its CPU blocks are free again, and a second copy into them in the same step would
        # race with this one.
        cpu = set(self.block_manager.get_cpu_block_ids(request_id))
        if cpu and self._between_steps.swap_out:
            plan = self._between_steps
            plan.swap_out = [(d, c) for d, c in plan.swap_out if c not in cpu]

    def preempt_request(self, request_id: str, mode: PreemptionMode | None = None) -> bool:
        """Preempt a running request now (tests, operator tools); False if it is not running.

        Its swap-out copies (if any) go out with the next ``schedule()``'s output.
        """
        req = self.running.get(request_id)
        if req is None:
            return False
        self._preempt(req, self._between_steps, mode)
        return True

    def _preempt_lower(self, priority: int, need_blocks: int, plan: StepPlan) -> bool:
        """Preempt one running request of strictly lower priority, but only if preempting
        all of them would give a seat and ``need_blocks`` free blocks (else waste no work)."""
        bm = self.block_manager
        lower = self._candidates(lambda r: may_preempt_for(priority, r.priority), plan)
        if not lower:
            return False
        freeable = bm.num_free_blocks + sum(bm.num_device_blocks_of(c.request_id) for c in lower)
        if len(self.running) - len(lower) >= self.config.max_num_seqs or freeable < need_blocks:
            return False
        victim_id = choose_victim(lower)
        assert victim_id is not None
        self._preempt(self.running[victim_id], plan)
        return True

    def _candidates(
        self, eligible: Callable[[Request], bool], plan: StepPlan
    ) -> list[VictimCandidate]:
        return [
            VictimCandidate(r.request_id, r.priority, r.arrival_time)
            for r in self.running.values()
            if r.request_id not in plan.swapped_in and eligible(r)
        ]

    def _preempt(self, req: Request, plan: StepPlan, mode: PreemptionMode | None = None) -> None:
        """Evict a running request: swap it to the CPU pool, or drop its KV (recompute)."""
        rid = req.request_id
        plan.unschedule(rid)
        del self.running[rid]
        mapping = None
        if (mode or self.config.preemption_mode) == "swap":
            mapping = self.block_manager.swap_out(rid)
        if mapping is not None:
            plan.swap_out.extend(mapping)
            plan.swapped_out[rid] = len(mapping)
            req.status = RequestStatus.SWAPPED
            self.swapped.add(req)
            self._counts.preemptions_swap += 1
        else:
            self.block_manager.free(rid)
            req.num_computed_tokens = 0
            req.status = RequestStatus.PREEMPTED
            self.waiting.add(req)
            self._counts.preemptions_recompute += 1
        req.num_preemptions += 1
        plan.preempted_ids.append(rid)
        plan.preempted.add(rid)
