"""The simulator against a straightforward slot model, and its accounting."""

from __future__ import annotations

import random

import pytest

from engine.core.config import CacheConfig, SchedulerConfig
from engine.sim.cost import FixedCost, StepShape, shape_of
from engine.sim.metrics import percentile
from engine.sim.simulator import EngineShape, Simulator
from engine.sim.workload import Lengths, RequestSpec, at_once, poisson


def reference_finish_steps(lens: list[int], slots: int, static: bool) -> list[int]:
    """Slots as in seed 000: a request runs ``len`` consecutive steps (its first token comes
    from the step that prefills it); continuous refills a seat on the next step, static only
    when the whole batch is done. Returns each request's last step (1-based)."""
    finish = [0] * len(lens)
    queue = list(range(len(lens)))
    running: dict[int, int] = {}  # request -> tokens left
    step = 0
    while queue or running:
        if not static or not running:
            while queue and len(running) < slots:
                rid = queue.pop(0)
                running[rid] = lens[rid]
        step += 1
        for rid in list(running):
            running[rid] -= 1
            if running[rid] == 0:
                finish[rid] = step
                del running[rid]
    return finish


@pytest.mark.parametrize("batching", ["continuous", "static"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fixed_cost_matches_the_slot_model(batching: str, seed: int) -> None:
    rng = random.Random(seed)
    lens = [rng.randint(1, 40) for _ in range(30)]
    slots = rng.randint(1, 6)
    sim = Simulator(FixedCost(0.05), SchedulerConfig(max_num_seqs=slots, batching=batching),
                    CacheConfig(enable_prefix_caching=False))
    specs = [RequestSpec(f"r{i}", n) for i, n in enumerate(lens)]
    got = sim.run(specs).by_id()
    want = reference_finish_steps(lens, slots, static=batching == "static")
    for i, step in enumerate(want):
        assert got[f"r{i}"].latency == pytest.approx(step * 0.05, abs=1e-9)
        assert got[f"r{i}"].output_tokens == lens[i]


def test_static_pads_finished_seats_and_the_cost_sees_them() -> None:
    seen: list[StepShape] = []

    class Recording(FixedCost):
        def step_seconds(self, shape: StepShape) -> float:
            seen.append(shape)
            return self.seconds

    sim = Simulator(Recording(1.0), SchedulerConfig(max_num_seqs=2, batching="static"),
                    CacheConfig(enable_prefix_caching=False))
    sim.run(at_once(2, [1, 3], prompt_len=4))
    # step 1: two prefills of 4 tokens; steps 2-3: one decode + one padding row
    assert [(s.rows, s.tokens) for s in seen] == [(2, 8), (2, 2), (2, 2)]


def test_dynamic_batching_waits_for_max_wait_on_the_virtual_clock() -> None:
    sim = Simulator(FixedCost(0.01), SchedulerConfig(max_num_seqs=4, batching="dynamic",
                                                     max_wait_ms=200))
    result = sim.run([RequestSpec("a", 2)])  # alone: the batch never fills, the wait expires
    rec = result.by_id()["a"]
    assert rec.first_token == pytest.approx(0.2 + 0.01)


def test_idle_gap_jumps_the_clock_to_the_next_arrival() -> None:
    sim = Simulator(FixedCost(0.1))
    result = sim.run([RequestSpec("a", 1, arrival=0.0), RequestSpec("b", 1, arrival=5.0)])
    assert result.by_id()["b"].latency == pytest.approx(0.1)
    assert len(result.steps) == 2


def test_priority_preemption_and_memory_come_from_the_scheduler() -> None:
    # 4 blocks of 4 tokens: two 8-token requests fill the cache; a third must preempt.
    sim = Simulator(FixedCost(0.01), SchedulerConfig(max_num_seqs=4),
                    CacheConfig(block_size=4, enable_prefix_caching=False), EngineShape(num_blocks=4))
    specs = [RequestSpec("low1", 6, 4, 0.0, "best-effort"), RequestSpec("low2", 6, 4, 0.0, "best-effort"),
             RequestSpec("hi", 2, 4, 0.015, "interactive")]
    result = sim.run(specs)
    assert result.preemptions >= 1
    assert {r.request_id: r.output_tokens for r in result.requests} == {"low1": 6, "low2": 6, "hi": 2}
    assert result.by_id()["hi"].finished < result.by_id()["low2"].finished


def test_prompt_that_never_fits_finishes_with_error_not_a_hang() -> None:
    sim = Simulator(FixedCost(0.01), cache=CacheConfig(block_size=4), shape=EngineShape(num_blocks=2))
    result = sim.run([RequestSpec("big", 4, prompt_len=20), RequestSpec("ok", 2, prompt_len=4)])
    by = result.by_id()
    assert by["big"].finish_reason == "error" and by["ok"].output_tokens == 2


def test_shape_of_counts_context() -> None:
    from engine.core.outputs import ScheduledRequest, SchedulerOutput
    from engine.core.sampling_params import SamplingParams

    p = SamplingParams()
    out = SchedulerOutput([ScheduledRequest("a", [1, 2, 3], 0, [], True, p, 0),
                           ScheduledRequest("b", [9], 10, [], True, p, 0)], num_padding_rows=1)
    assert shape_of(out) == StepShape(rows=3, tokens=5, kv_tokens=3 + 11 + 1, prefill_rows=1)


def test_poisson_workload_is_seeded_and_shares_tiers() -> None:
    a = poisson(5.0, 400, Lengths(8, 64), Lengths(4, 16), {"interactive": 3, "batch": 1}, seed=3)
    b = poisson(5.0, 400, Lengths(8, 64), Lengths(4, 16), {"interactive": 3, "batch": 1}, seed=3)
    assert a == b
    share = sum(s.tier == "interactive" for s in a) / len(a)
    assert 0.65 < share < 0.85
    assert all(8 <= s.prompt_len <= 64 and 4 <= s.output_len <= 16 for s in a)
    assert 400 / a[-1].arrival == pytest.approx(5.0, rel=0.2)


def test_percentile_matches_numpy() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    xs = [rng.random() for _ in range(37)]
    for q in (0, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_replayed_step_times_reproduce_a_run() -> None:
    from engine.sim.cost import ReplayCost

    specs = poisson(3.0, 60, Lengths(8, 64), Lengths(4, 24), seed=5)
    varied = Simulator(_Varied(), SchedulerConfig(max_num_seqs=4)).run(specs)
    replay = Simulator(ReplayCost([s.seconds for s in varied.steps]),
                       SchedulerConfig(max_num_seqs=4)).run(specs)
    assert [s.scheduled_ids for s in replay.steps] == [s.scheduled_ids for s in varied.steps]
    assert replay.by_id() == varied.by_id()


class _Varied:
    """A cost that depends on the shape and the step count (as real steps do)."""

    name = "varied"

    def __init__(self) -> None:
        self.n = 0

    def step_seconds(self, shape: StepShape) -> float:
        self.n += 1
        return 0.01 + 0.002 * shape.rows + 0.0001 * shape.tokens + 0.005 * (self.n % 3)

    def decode_seconds(self, rows: int, kv_per_row: float,
                       constrained_rows: float = 0) -> float:
        return 0.01 + 0.002 * rows
