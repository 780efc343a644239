"""Plain dataclasses that cross boundaries: scheduler -> runner -> scheduler -> caller.

Torch-free: the runner turns these lists into tensors; everything before it is testable
without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams


@dataclass(slots=True)  # built for every row of every step: slots make that and reads cheaper
class ScheduledRequest:
    """One request's share of a step.

    ``token_ids`` are the tokens to compute now, at positions
    ``start_pos .. start_pos + len(token_ids) - 1``. ``block_ids`` is the request's whole
    device block table (covering at least ``start_pos + len(token_ids)`` tokens).
    ``sample`` is true when this step reaches the end of the known tokens, so the last
    position's logits produce the next token; false for a non-final prefill chunk.
    ``output_index`` is how many output tokens exist already (seeded sampling uses it).
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool
    sampling_params: SamplingParams
    output_index: int
    # (prompt ids, output ids so far): the request's own lists, set only when its penalties
    # read them (``SamplingParams.needs_history``); the runner reads them before the update.
    history: tuple[list[int], list[int]] | None = None
    eos_token_id: int | None = None  # banned with the stop ids while short of min_tokens
    # the request's priority (0 most urgent): the worker's step budget tells interactive's
    # rows from the lower tiers' in each step it watches
    priority: int = 0


@dataclass
class SchedulerOutput:
    """What the runner must do this step, in this order: swap_out, copies, swap_in, forward.

    ``copies`` are partial prefix-cache blocks copied into a new request's own block: read
    all sources, then write all destinations (a source may be another copy's destination).
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device_block, cpu_block)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (device_block, device_block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu_block, device_block)
    preempted_ids: list[str] = field(default_factory=list)
    # Of ``preempted_ids``, those swapped to the CPU pool -> how many blocks moved; the rest
    # were preempted by recompute (swap falls back to it when the CPU pool is full).
    swapped_out: dict[str, int] = field(default_factory=dict)
    finished_ids: list[str] = field(default_factory=list)  # finished/aborted since last step
    # Fixed-shape (static/dynamic) batches only: seats whose member finished while the batch
    # runs. The runner computes that many dummy decode rows and discards them.
    num_padding_rows: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not (self.scheduled or self.swap_out or self.swap_in or self.copies)


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the best alternatives (id, logprob), best first,
    from the model's raw distribution (before penalties, bias and temperature)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class ModelRunnerOutput:
    """Sampled next token per request that had ``sample=True``; its logprobs when asked."""

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)


@dataclass
class RequestOutput:
    """Incremental output of one request after one engine step (a delta, not a total)."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    # time.monotonic stamps for observability
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    # the engine's step numbers of its first scheduling and of its first token (None: not yet)
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    num_preemptions: int = 0
    # one per token of ``new_token_ids`` when the request asked for logprobs
    logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    # n > 1 (``parallel_sampling.GroupOutputs``): which sequence this delta belongs to, and
    # its own finish reason once it ended (``finished`` waits for every sequence)
    index: int = 0
    choice_finish: str | None = None


@dataclass
class CompletionOutput:
    """Final result of one offline ``LLM.generate`` prompt."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None
