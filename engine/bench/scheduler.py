"""Scheduler CPU cost per step: ``schedule()`` + ``update_from_output()`` with a fake runner.

No torch, no model: this is the engine's own overhead per step, which must stay well under
a forward pass (target <= 1 ms at 256 running decode requests).
"""

from __future__ import annotations

import time

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler

_VOCAB = 49152


def _fake_execute(out: SchedulerOutput) -> ModelRunnerOutput:
    # Deterministic in (last token, position): cheap, like a real runner's bookkeeping.
    return ModelRunnerOutput(
        sampled={
            s.request_id: (s.token_ids[-1] * 31 + s.start_pos + len(s.token_ids)) % _VOCAB
            for s in out.scheduled
            if s.sample
        }
    )


def measure_scheduler_step_ms(
    num_running: int = 256, steps: int = 200, prompt_len: int = 64, block_size: int = 16
) -> float:
    """Median ms of schedule + update over ``steps`` decode steps at ``num_running`` running."""
    per_request = (prompt_len + steps * 3) // block_size + 2
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=num_running, max_num_batched_tokens=max(2048, num_running)),
        CacheConfig(block_size=block_size),
        num_blocks=num_running * per_request,
        num_cpu_blocks=0,
    )
    params = SamplingParams(max_tokens=10**6, ignore_eos=True)
    for i in range(num_running):
        prompt = [(i * 7 + j) % _VOCAB for j in range(prompt_len)]
        sched.add_request(Request(f"bench-{i}", prompt, params, arrival_time=float(i)))
    # Prefill until every request is decoding (one token per step).
    while sched.stats.num_running < num_running or any(
        r.num_computed_tokens < r.num_tokens - 1 for r in sched.running.values()
    ):
        out = sched.schedule()
        sched.update_from_output(out, _fake_execute(out))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        res = _fake_execute(out)
        t2 = time.perf_counter()
        sched.update_from_output(out, res)
        t3 = time.perf_counter()
        assert len(out.scheduled) == num_running
        times.append((t1 - t0) + (t3 - t2))
    times.sort()
    return times[len(times) // 2] * 1e3


if __name__ == "__main__":
    for n in (64, 256):
        print(f"scheduler step (schedule + update), {n} running: {measure_scheduler_step_ms(n):.3f} ms")
