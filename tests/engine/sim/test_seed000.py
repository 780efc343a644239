"""Seed 000's worked numbers, reproduced by the simulator exactly (to float rounding).

The expected values are the seed's own tables (shared/seeds 000): 4 slots, 50 ms a step,
prefill counted as zero."""

from __future__ import annotations

import pytest

from engine.sim import seed000
from gateway.cli.simulate import seed000_report

EXACT = 1e-9


def test_five_requests_static_vs_continuous() -> None:
    five = seed000.five_requests()
    assert five.static.makespan == pytest.approx(11.5, abs=EXACT)
    assert five.continuous.makespan == pytest.approx(10.0, abs=EXACT)
    assert five.static.output_tokens == five.continuous.output_tokens == 400
    expected = {"A": (5.0, 5.0), "B": (1.0, 1.0), "C": (2.5, 2.5), "D": (10.0, 10.0),
                "E": (11.5, 2.5)}
    st, co = five.static.by_id(), five.continuous.by_id()
    for rid, (static_s, continuous_s) in expected.items():
        assert st[rid].latency == pytest.approx(static_s, abs=EXACT), rid
        assert co[rid].latency == pytest.approx(continuous_s, abs=EXACT), rid
    mean = lambda r: sum(x.latency for x in r.requests) / len(r.requests)
    assert mean(five.static) == pytest.approx(6.0, abs=EXACT)
    assert mean(five.continuous) == pytest.approx(4.2, abs=EXACT)


def test_e_takes_bs_seat_at_step_20_only_when_continuous() -> None:
    five = seed000.five_requests()
    co = five.continuous.steps
    assert all("E" not in s.scheduled_ids for s in co[:20])
    assert co[20].scheduled_ids == ("A", "C", "D", "E")  # step 21: B's seat, refilled
    st = five.static.steps
    assert all("E" not in s.scheduled_ids for s in st[:200])
    assert st[200].scheduled_ids == ("E",)


def test_hundred_request_mix() -> None:
    mix = seed000.mix()
    assert mix.tokens == 11_000
    assert mix.static.makespan == pytest.approx(250.0, abs=EXACT)
    assert mix.tokens / mix.static.makespan == pytest.approx(44.0, abs=EXACT)
    sat = seed000.saturated_seconds(mix.saturated)
    assert sat == pytest.approx(137.5, abs=EXACT)
    assert mix.tokens / sat == pytest.approx(80.0, abs=EXACT)
    assert all(s.rows == seed000.SLOTS for s in mix.saturated.steps)  # every seat, every step
    # The finite queue runs dry: slower than the seed's steady state, faster than static.
    assert sat < mix.continuous.makespan < mix.static.makespan
    empty_seat_steps = sum(seed000.SLOTS - s.rows for s in mix.continuous.steps)
    assert mix.continuous.makespan == pytest.approx(
        sat + empty_seat_steps * seed000.STEP_S / seed000.SLOTS, abs=EXACT)


def test_report_prints_both_tables() -> None:
    text = seed000_report()
    for needle in ("11.5 s", "10.0 s", "E (30 tokens)    11.5 s  2.5 s", "6.0 s   4.2 s",
                   "250.0 s", "44 tok/s", "137.5 s", "80 tok/s", "queue kept full",
                   "these 100 requests only"):
        assert needle in text, needle
