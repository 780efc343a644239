"""A request's state inside the engine. Torch-free.

Progress is one counter: ``num_computed_tokens`` catches up to ``num_tokens``
(prompt + generated). Prefill, chunked prefill, decode and re-prefill after a
recompute preemption are all the same thing: computing the tokens not yet computed.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from engine.core.finish import FinishReason
from engine.core.outputs import TokenLogprob
from engine.core.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Ordered: everything above PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2  # preempted in swap mode: KV lives in the CPU pool
    PREEMPTED = 3  # preempted in recompute mode: back in waiting, KV dropped
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass
class RequestTimes:
    """Wall-clock stamps (time.monotonic) for observability."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    # the scheduler's step numbers (``SchedulerStats.num_steps``) of the step that first
    # scheduled it and of the step that computed its first token: the TTFT budget counts steps
    first_scheduled_step: int | None = None
    first_token_step: int | None = None


class Request:
    # the scheduler reads these for every running request every step: slots make it cheaper
    __slots__ = (
        "eos_token_id",
        "error",
        "first_token_urgent",
        "last_scheduled_step",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "output_logprobs",
        "output_token_ids",
        "priority",
        "prompt_token_ids",
        "request_id",
        "sampling_params",
        "status",
        "times",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        eos_token_id: int | None = None,
        first_token_urgent: bool = False,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must have at least one token")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.priority = priority  # 0 is most urgent
        # The step computing its first token is capped like an urgent arrival's
        # (``engine.core.row_cap``: a tenant under its share beside one over it).
        self.first_token_urgent = first_token_urgent
        self.eos_token_id = eos_token_id
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[TokenLogprob] = []  # per output token, when asked for
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache when admitted
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.last_scheduled_step = -1  # the scheduler's step count when it last ran
        self.error: str | None = None
        self.times = RequestTimes(arrival=time.monotonic() if arrival_time is None else arrival_time)

    @property
    def arrival_time(self) -> float:
        return self.times.arrival

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def awaits_urgent_first_token(self) -> bool:
        """Marked ``first_token_urgent`` and no token yet: only its first step is capped."""
        return self.first_token_urgent and not self.output_token_ids

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prio={self.priority}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
