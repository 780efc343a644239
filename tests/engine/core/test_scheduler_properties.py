"""Property test: random add (n = 1 to 3 sequences) / step / abort / forced-preempt sequences
with the fake runner.

After every operation the block manager's invariants hold; once the scheduler is drained all
device and CPU blocks are free, every request finished, and its tokens are the independent
reference (or a prefix of it, when aborted or out of cache).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.core.request import Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from tests.engine.fakes import FakeClock, FakeRunner, make_scheduler, reference_tokens

PREFIX = [11, 12, 13, 14, 15, 16, 17, 18, 19]

configs = st.fixed_dictionaries(
    {
        "num_blocks": st.integers(2, 16),
        "num_cpu_blocks": st.integers(0, 16),
        "block_size": st.sampled_from([1, 2, 4, 8]),
        "max_num_batched_tokens": st.integers(1, 32),
        "max_num_seqs": st.integers(1, 6),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "batching": st.sampled_from(["continuous", "continuous", "static", "dynamic"]),
        "enable_chunked_prefill": st.sampled_from([True, True, True, False]),
        "enable_prefix_caching": st.booleans(),
    }
)
add = st.tuples(
    st.just("add"), st.integers(1, 24), st.integers(1, 16), st.integers(0, 2), st.booleans(),
    st.sampled_from([1, 1, 2, 3]),  # n: parallel sampling forks sequences holding blocks
)
ops = st.lists(
    st.one_of(
        add,
        add,
        st.tuples(st.just("step")),
        st.tuples(st.just("abort"), st.integers(0, 50)),
        st.tuples(st.just("preempt"), st.integers(0, 50), st.sampled_from(["recompute", "swap"])),
    ),
    min_size=6,
    max_size=60,
)


def _step(sched: Any, runner: FakeRunner, clock: FakeClock) -> None:
    out = sched.schedule()
    sched.update_from_output(out, runner.execute(out))
    clock.advance(0.01)  # lets dynamic batching time out
    bm = sched.block_manager
    if bm.enable_prefix_caching:  # every full block of a running request is hashed: the
        # update looks blocks up only when a step fills one (``update_from_output``)
        for rid, req in sched.running.items():
            assert bm.num_cached_blocks_of(rid) == req.num_computed_tokens // bm.block_size


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, script=ops)
def test_random_operations_keep_the_cache_consistent(config: dict[str, Any], script: list[tuple]) -> None:
    clock = FakeClock(0.0)
    sched = make_scheduler(clock=clock, **config)
    runner = FakeRunner(sched)
    bm = sched.block_manager
    reqs: list[Request] = []
    for op in script:
        if op[0] == "add":
            _, n, max_tokens, prio, shared, seqs = op
            k = len(reqs)
            prompt = (PREFIX if shared else []) + [(k * 13 + j) % 97 for j in range(n)]
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=seqs)
            req = Request(f"p{k}", prompt, params, priority=prio, arrival_time=clock.now)
            reqs.append(req)
            sched.add_request(req)
        elif op[0] == "step":
            _step(sched, runner, clock)
        elif op[0] == "abort" and reqs:
            sched.abort_request(reqs[op[1] % len(reqs)].request_id)
        elif op[0] == "preempt" and reqs:
            sched.preempt_request(reqs[op[1] % len(reqs)].request_id, op[2])
        bm.check_integrity()
    for _ in range(3000):
        if not sched.has_unfinished_requests():
            break
        _step(sched, runner, clock)
        bm.check_integrity()
    assert not sched.has_unfinished_requests(), sched.stats
    stats = sched.stats
    for name in ("preemptions_swap", "preemptions_recompute", "aborts", "errors", "prefix_cache_hits"):
        event(f"{name} > 0: {getattr(stats, name) > 0}")
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == bm.num_blocks
    assert bm.num_used_cpu_blocks == 0
    for req in reqs:
        assert req.is_finished, req
        ref = reference_tokens(req)
        if req.status == RequestStatus.FINISHED_LENGTH:
            assert req.output_token_ids == ref
        else:
            assert req.status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR)
            assert req.output_token_ids == ref[: req.num_output_tokens]
            assert (req.error is not None) == (req.status == RequestStatus.FINISHED_ERROR)
