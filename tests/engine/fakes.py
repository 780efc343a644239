"""Factories and a fake runner for torch-free scheduler tests.

The fake runner's next token is a pure function of the request's token history, so a
correct scheduler gives every request the same tokens whatever the batch, budget, pool size
or preemption mode. It also simulates the KV cache: each block slot holds the token id
written there, swaps and copies move slots in the documented order (swap_out, copies,
swap_in, forward), and a forward checks that every earlier position of the request reads
back its own token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler

VOCAB = 101


def next_token(history: Sequence[int]) -> int:
    """Deterministic in the token history only."""
    return (sum(history) * 31 + len(history)) % VOCAB


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_scheduler(
    num_blocks: int = 64,
    num_cpu_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int | None = None,
    clock: Any = None,
    enable_prefix_caching: bool = True,
    **sched_overrides: Any,
) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, **sched_overrides})
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    return Scheduler(
        config, cache, num_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks,
        max_model_len=max_model_len, clock=clock or FakeClock(),
    )


_ids = itertools.count()


def make_requests(
    n: int,
    prompt_len: int | Sequence[int] = 6,
    max_tokens: int | Sequence[int] = 5,
    priority: int | Sequence[int] = 0,
    start_time: float = 0.0,
    prefix: Sequence[int] = (),
    **params: Any,
) -> list[Request]:
    """``n`` requests with distinct prompts (after an optional shared ``prefix``)."""

    def pick(v: int | Sequence[int], i: int) -> int:
        return v if isinstance(v, int) else v[i % len(v)]

    reqs = []
    for i in range(n):
        k = next(_ids)
        prompt = list(prefix) + [(k * 7 + j * 3 + 1) % VOCAB for j in range(pick(prompt_len, i))]
        reqs.append(
            Request(
                f"r{k}",
                prompt,
                SamplingParams(max_tokens=pick(max_tokens, i), ignore_eos=True, **params),
                priority=pick(priority, i),
                arrival_time=start_time + i * 1e-3,
            )
        )
    return reqs


class FakeRunner:
    """Executes a SchedulerOutput against a simulated token-id KV cache."""

    def __init__(self, scheduler: Scheduler, check_kv: bool = True) -> None:
        bm = scheduler.block_manager
        self.block_size = bm.block_size
        self.device: list[list[int | None]] = [[None] * bm.block_size for _ in range(bm.num_blocks)]
        self.cpu: list[list[int | None]] = [[None] * bm.block_size for _ in range(bm.num_cpu_blocks)]
        self.check_kv = check_kv
        self.steps = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for dev, cpu in out.swap_out:
            self.cpu[cpu] = list(self.device[dev])
        sources = [list(self.device[src]) for src, _ in out.copies]  # read all, then write
        for (_, dst), tokens in zip(out.copies, sources, strict=True):
            self.device[dst] = tokens
        for cpu, dev in out.swap_in:
            self.device[dev] = list(self.cpu[cpu])
        sampled: dict[str, int] = {}
        bs = self.block_size
        for s in out.scheduled:
            history: list[int] = []
            if self.check_kv:
                for pos in range(s.start_pos):
                    history.append(self._read(s.block_ids, pos, s.request_id))
            for i, tok in enumerate(s.token_ids):
                pos = s.start_pos + i
                self.device[s.block_ids[pos // bs]][pos % bs] = tok
            if s.sample:
                if self.check_kv:
                    sampled[s.request_id] = next_token(history + s.token_ids)
                else:
                    raise ValueError("sampling needs check_kv=True (history comes from the KV)")
        self.steps += 1
        return ModelRunnerOutput(sampled=sampled)

    def _read(self, block_ids: list[int], pos: int, rid: str) -> int:
        tok = self.device[block_ids[pos // self.block_size]][pos % self.block_size]
        if tok is None:
            raise AssertionError(f"{rid}: KV at position {pos} was never written")
        return tok


def reference_tokens(req: Request) -> list[int]:
    """What the request must produce (no stop tokens, ignore_eos): independent of scheduling."""
    history = list(req.prompt_token_ids)
    out = []
    for _ in range(req.sampling_params.max_tokens):
        tok = next_token(history)
        out.append(tok)
        history.append(tok)
    return out


def run_to_completion(
    sched: Scheduler, runner: FakeRunner, max_steps: int = 10_000, check: bool = True
) -> list[Request]:
    """Step until idle; returns every request returned by update_from_output, in order."""
    returned: list[Request] = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return returned
        out = sched.schedule()
        res = runner.execute(out)
        returned.extend(sched.update_from_output(out, res))
        if check:
            sched.block_manager.check_integrity()
    raise AssertionError(f"not idle after {max_steps} steps: {sched.stats}")


def step(sched: Scheduler, runner: FakeRunner) -> tuple[SchedulerOutput, list[Request]]:
    """One engine step; checks block integrity afterwards."""
    out = sched.schedule()
    changed = sched.update_from_output(out, runner.execute(out))
    sched.block_manager.check_integrity()
    return out, changed


def shares(out: SchedulerOutput) -> dict[str, int]:
    """request id -> tokens scheduled in this step."""
    return {s.request_id: len(s.token_ids) for s in out.scheduled}
