"""Per-step scratch state of ``Scheduler.schedule()`` and small request helpers. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.outputs import ScheduledRequest, SchedulerOutput
from engine.core.request import Request


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
    swapped_out: dict[str, int] = field(default_factory=dict)  # preempted by swap -> blocks
    swapped_in: set[str] = field(default_factory=set)  # protected from preemption this step
    memory_preempted: bool = False  # running phase ran out of blocks
    blocked_priority: int | None = None  # a swapped request of this priority could not resume

    def add(self, req: Request, num_new: int, block_ids: list[int]) -> None:
        """Schedule ``num_new`` tokens of ``req`` from its ``num_computed_tokens`` on."""
        start = req.num_computed_tokens
        end = start + num_new
        prompt, output = req.prompt_token_ids, req.output_token_ids
        params = req.sampling_params
        done = len(prompt) + len(output)
        # a decode row's one token (the hot path: every running request, every step)
        tokens = [output[-1]] if end == done and num_new == 1 and output else \
            token_slice(req, start, end)
        self.scheduled[req.request_id] = ScheduledRequest(
            req.request_id,
            tokens,
            start,
            block_ids[:],  # a copy: the block table keeps growing after this step
            end == done,  # sample only when this chunk reaches the known end
            params,
            len(output),
            # penalties and grammars read the tokens so far: only then (hot path)
            (prompt, output) if params.reads_history else None,
            req.eos_token_id,
            req.priority,
        )
        self.budget -= num_new

    def add_decode(self, req: Request, block_ids: list[int]) -> None:
        """``add(req, 1, block_ids)`` for a request whose one new token is its last known one
        (a decode row: every running request, every step), without the general case's
        slicing and tests."""
        prompt, output = req.prompt_token_ids, req.output_token_ids
        params = req.sampling_params
        self.scheduled[req.request_id] = ScheduledRequest(
            req.request_id,
            [output[-1] if output else prompt[-1]],
            req.num_computed_tokens,
            block_ids[:],
            True,
            params,
            len(output),
            (prompt, output) if params.reads_history else None,
            req.eos_token_id,
            req.priority,
        )
        self.budget -= 1

    def unschedule(self, request_id: str) -> None:
        """Take a request's share back out (it was preempted later in the same step)."""
        sched = self.scheduled.pop(request_id, None)
        if sched is not None:
            self.budget += len(sched.token_ids)

    def to_output(self, finished_ids: list[str], copies: list[tuple[int, int]]) -> SchedulerOutput:
        return SchedulerOutput(
            scheduled=list(self.scheduled.values()),
            swap_out=self.swap_out,
            copies=copies,
            swap_in=self.swap_in,
            preempted_ids=self.preempted_ids,
            swapped_out=self.swapped_out,
            finished_ids=finished_ids,
        )
