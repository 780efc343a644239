"""Per-step scratch state of ``Scheduler.schedule()`` and small request helpers. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.outputs import ScheduledRequest, SchedulerOutput
from engine.request import Request


def token_slice(req: Request, start: int, end: int) -> list[int]:
    """``req.all_token_ids[start:end]`` without building the concatenation."""
    prompt = req.prompt_token_ids
    n = len(prompt)
    if end <= n:
        return prompt[start:end]
    if start >= n:
        return req.output_token_ids[start - n : end - n]
    return prompt[start:] + req.output_token_ids[: end - n]


@dataclass
class StepPlan:
    """What one schedule() call has decided so far; becomes the SchedulerOutput."""

    budget: int  # tokens left under max_num_batched_tokens
    scheduled: dict[str, ScheduledRequest] = field(default_factory=dict)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)
    swapped_in: set[str] = field(default_factory=set)  # protected from preemption this step
    memory_preempted: bool = False  # running phase ran out of blocks
    blocked_priority: int | None = None  # a swapped request of this priority could not resume

    def add(self, sched: ScheduledRequest) -> None:
        self.scheduled[sched.request_id] = sched
        self.budget -= len(sched.token_ids)

    def unschedule(self, request_id: str) -> None:
        """Take a request's share back out (it was preempted later in the same step)."""
        sched = self.scheduled.pop(request_id, None)
        if sched is not None:
            self.budget += len(sched.token_ids)

    def to_output(self, finished_ids: list[str]) -> SchedulerOutput:
        return SchedulerOutput(
            scheduled=list(self.scheduled.values()),
            swap_out=self.swap_out,
            swap_in=self.swap_in,
            preempted_ids=self.preempted_ids,
            finished_ids=finished_ids,
        )
