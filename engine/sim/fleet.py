"""A fleet of simulated instances behind the pull queue, with or without prefix-aware
placement (``policies.placement``), on one virtual timeline.

Each instance is the single-instance simulation (``Simulator.instance``: the engine's own
scheduler and prefix cache on the cost model), advanced to each arrival before the arrival is
routed, so routing sees every instance's load (running + waiting) at that moment:

- without placement (the plain pull: whichever worker has room takes the entry), the least
  loaded instance, ties rotating;
- with placement, the gateway's choice: the rendezvous order of the prompt's leading KV
  blocks, bounded by the recent placements (``bounded_choice`` over ``window_size``, as
  ``gateway/http/placement.py``). If that instance has no free seat and another has, the
  other steals the entry after the wait: it starts there ``wait_s`` late (its TTFT counts
  the wait).

``compare`` runs both on one workload: the prefix-cache hit tokens, TTFT p50/p99 and the
requests per instance that ``carpool plan --shared-prefixes`` reports.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.core.config import CacheConfig, SchedulerConfig
from engine.sim.cost import CostModel
from engine.sim.metrics import RequestRecord, percentile
from engine.sim.planner import Plan
from engine.sim.simulator import EngineShape, Simulator
from engine.sim.workload import RequestSpec, chat_sessions
from policies.placement import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_MAX_BLOCKS,
    bounded_choice,
    prefix_key,
    rank,
    window_size,
)

PLAN_CHATS_MIN, PLAN_CHATS_MAX = 24, 96  # chats of 3 turns that ``plan_placement`` runs


@dataclass(frozen=True)
class FleetPolicy:
    placement: bool
    wait_s: float = 0.075
    max_blocks: int = DEFAULT_MAX_BLOCKS
    load_factor: float = DEFAULT_LOAD_FACTOR


@dataclass
class FleetResult:
    records: list[RequestRecord]
    per_instance: list[int]  # requests each instance ran
    prompt_tokens: int
    stolen: int = 0  # requests another instance took after the wait

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.records)

    def ttft(self, q: float) -> float:
        """The ``q``-th percentile (0..100) of the time to first token."""
        return percentile([t for r in self.records if (t := r.ttft) is not None], q)

    @property
    def spread(self) -> float:
        """The busiest instance's requests over the mean."""
        mean = sum(self.per_instance) / len(self.per_instance)
        return max(self.per_instance) / mean if mean else 0.0


class _Router:
    def __init__(self, policy: FleetPolicy, instances: int, block_size: int, seats: int) -> None:
        self.policy, self.block_size, self.seats = policy, block_size, seats
        self.names = [f"instance-{k}" for k in range(instances)]
        self.turn = 0
        self.recent: deque[str] = deque(maxlen=window_size(instances))
        self.counts: Counter[str] = Counter()

    def route(self, spec: RequestSpec, loads: Sequence[int]) -> tuple[int, float]:
        """The instance ``spec`` runs on, and how late it starts there."""
        n = len(loads)
        self.turn += 1
        least = min(range(n), key=lambda k: (loads[k], (k - self.turn) % n))
        key = prefix_key(spec.prompt_ids, self.block_size, self.policy.max_blocks) \
            if self.policy.placement else None
        if key is None:
            return least, 0.0
        window = self.recent.maxlen
        chosen = bounded_choice(rank(key, self.names), self.counts, self.policy.load_factor,
                                window)
        assert chosen is not None
        if len(self.recent) == window:
            self.counts[self.recent[0]] -= 1
        self.recent.append(chosen)
        self.counts[chosen] += 1
        want = self.names.index(chosen)
        if loads[want] >= self.seats and loads[least] < self.seats:
            return least, self.policy.wait_s  # stolen after the wait
        return want, 0.0


def simulate_fleet(sim: Simulator, workload: Iterable[RequestSpec], instances: int,
                   policy: FleetPolicy) -> FleetResult:
    """Run ``workload`` on ``instances`` copies of ``sim``'s engine, routed by ``policy``."""
    if instances < 1:
        raise ValueError("a fleet needs at least one instance")
    runs = [sim.instance() for _ in range(instances)]
    router = _Router(policy, instances, sim.cache_config.block_size,
                     sim.scheduler_config.max_num_seqs)
    specs = sorted(workload, key=lambda s: s.arrival)
    per = [0] * instances
    late: dict[str, float] = {}
    for spec in specs:
        for run in runs:
            run.advance(spec.arrival)
        loads = [len(r.scheduler.running) + len(r.scheduler.waiting)
                 + len(r.pending) - r.next_pending for r in runs]
        k, delay = router.route(spec, loads)
        per[k] += 1
        if delay:
            late[spec.request_id] = delay
            spec = dataclasses.replace(spec, arrival=spec.arrival + delay)
        bisect.insort(runs[k].pending, spec, lo=runs[k].next_pending, key=lambda s: s.arrival)
    records: list[RequestRecord] = []
    for run in runs:
        run.advance(math.inf)
        records += [dataclasses.replace(r, arrival=r.arrival - late.get(r.request_id, 0.0))
                    for r in run.result.requests]
    return FleetResult(records, per, sum(s.prompt_len for s in specs), len(late))


def compare(sim: Simulator, workload: Sequence[RequestSpec], instances: int,
            wait_s: float = 0.075) -> dict[str, FleetResult]:
    """The same workload with placement, without it, and on one instance alone (the cache
    reuse one prefix cache gets)."""
    return {"placement": simulate_fleet(sim, workload, instances, FleetPolicy(True, wait_s)),
            "no placement": simulate_fleet(sim, workload, instances, FleetPolicy(False)),
            "one instance": simulate_fleet(sim, workload, 1, FleetPolicy(False))}


def plan_placement(plan: Plan, cost: CostModel, prefixes: int, prefix_tokens: int,
                   skewed: bool = False, wait_s: float = 0.075) -> dict[str, FleetResult]:
    """What placement buys the plan's fleet (its final instances, batch, token budget and KV
    blocks) at its peak, on multi-turn chats over ``prefixes`` shared prompts of
    ``prefix_tokens`` tokens (``workload.chat_sessions``): ``compare``'s three runs."""
    final, inputs = plan.final, plan.inputs
    assert final is not None and plan.kv is not None
    chats = min(PLAN_CHATS_MAX, max(PLAN_CHATS_MIN, math.ceil(inputs.peak_rps * 60 / 3)))
    specs = chat_sessions(inputs.peak_rps, chats, prefixes, prefix_tokens,
                          output_len=max(1, round(inputs.output.mean)), skewed=skewed,
                          seed=inputs.seed)
    sim = Simulator(cost, SchedulerConfig(max_num_seqs=final.batch,
                                          max_num_batched_tokens=final.token_budget),
                    CacheConfig(block_size=inputs.block_size),
                    EngineShape(num_blocks=plan.kv.num_blocks))
    return compare(sim, specs, final.instances, wait_s)
