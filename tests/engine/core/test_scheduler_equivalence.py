"""The fake runner's tokens depend only on each request's token history (read back through
the simulated KV cache), so any correct schedule gives every request the same tokens."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.request import Request
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    step,
)

SHARED = [7, 3, 5, 1, 8, 8, 2, 9, 4, 6]  # 2.5 blocks of 4


def workload() -> list[Request]:
    reqs = make_requests(8, prompt_len=[3, 11, 6, 17], max_tokens=[4, 15, 9], priority=[0, 1, 2])
    reqs += make_requests(4, prompt_len=[2, 5], max_tokens=[6, 12], prefix=SHARED, start_time=0.5)
    return reqs


CONFIGS: list[dict[str, Any]] = [
    {},
    {"max_num_batched_tokens": 5},
    {"max_num_batched_tokens": 3, "max_num_seqs": 3},
    {"num_blocks": 12, "preemption_mode": "recompute"},
    {"num_blocks": 12, "preemption_mode": "swap"},
    {"num_blocks": 9, "preemption_mode": "swap", "num_cpu_blocks": 4},  # swap falls back
    {"num_blocks": 10, "max_num_batched_tokens": 7, "preemption_mode": "swap"},
    {"num_blocks": 10, "enable_prefix_caching": False},
    {"block_size": 1, "num_blocks": 40},
    {"block_size": 16, "num_blocks": 4, "max_num_batched_tokens": 20},
    {"batching": "static", "max_num_seqs": 4},
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 32},
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_tokens_do_not_depend_on_the_schedule(overrides: dict[str, Any]) -> None:
    sched = make_scheduler(**overrides)
    runner = FakeRunner(sched)
    reqs = workload()
    # Half arrive up front, the rest while others run.
    for r in reqs[::2]:
        sched.add_request(r)
    for r in reqs[1::2]:
        step(sched, runner)
        sched.add_request(r)
    run_to_completion(sched, runner)
    for r in reqs:
        assert r.error is None, r.error
        assert r.output_token_ids == reference_tokens(r), r
    bm = sched.block_manager
    assert bm.num_used_blocks == 0 and bm.num_used_cpu_blocks == 0
    if overrides.get("num_blocks", 64) <= 12:
        assert sched.stats.preemptions > 0  # the small pools really forced preemption
