"""Seed 000's worked example, reproduced by simulation (not by arithmetic).

4 slots, every step 50 ms, prefill counted as zero (``FixedCost(0.05)``: a request's first
token comes out of the step that prefills it, at the same price as any decode step).

1. Requests A100, B20, C50, D200 at t=0 and E30 right behind them: static batching (a batch
   runs until its last member finishes) against continuous batching (a finished seat is
   refilled on the next step). Seed: static 11.5 s vs continuous 10.0 s; latencies A 5.0/5.0,
   B 1.0/1.0, C 2.5/2.5, D 10.0/10.0, E 11.5/2.5 s; mean 6.0 vs 4.2 s.
2. 100 requests, 50 x 20 and 50 x 200 tokens, alternating (each static batch holds two of
   each, the seed's "average batch"): static 250 s = 44 tok/s; continuous 137.5 s = 80 tok/s
   *while the queue keeps every seat full* (``keep_waiting``: the run stops at 11,000 tokens
   with the queue still full). With only these 100 requests the last long ones run with
   seats empty, so the finite-queue continuous run takes longer than 137.5 s; both are
   reported.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from engine.core.config import CacheConfig, SchedulerConfig
from engine.sim.cost import FixedCost
from engine.sim.metrics import RunResult
from engine.sim.simulator import Simulator
from engine.sim.workload import RequestSpec, at_once, fixed

SLOTS = 4
STEP_S = 0.050
FIVE = {"A": 100, "B": 20, "C": 50, "D": 200, "E": 30}
MIX = (20, 200)
MIX_N = 100


def simulator(batching: str, slots: int = SLOTS, step_s: float = STEP_S) -> Simulator:
    return Simulator(FixedCost(step_s),
                     SchedulerConfig(max_num_seqs=slots, batching=batching),  # type: ignore[arg-type]
                     CacheConfig(enable_prefix_caching=False))


@dataclass(frozen=True)
class FiveRequests:
    static: RunResult
    continuous: RunResult


def five_requests() -> FiveRequests:
    wl = fixed(FIVE)
    return FiveRequests(simulator("static").run(wl), simulator("continuous").run(wl))


@dataclass(frozen=True)
class Mix:
    static: RunResult
    continuous: RunResult  # the 100 requests only: the queue runs dry at the end
    saturated: RunResult  # the queue kept full until the mix's tokens were produced
    tokens: int


def _endless_mix() -> Iterator[RequestSpec]:
    for i in itertools.count():
        yield RequestSpec(f"s{i}", MIX[i % len(MIX)])


def mix() -> Mix:
    wl = at_once(MIX_N, MIX)
    tokens = sum(s.output_len for s in wl)
    saturated = simulator("continuous").run([], refill=_endless_mix(), keep_waiting=SLOTS,
                                            until_tokens=tokens)
    return Mix(simulator("static").run(wl), simulator("continuous").run(wl), saturated, tokens)


def saturated_seconds(result: RunResult) -> float:
    """A saturated run's duration: it ends when the token count is reached, mid-requests."""
    return result.end_time
