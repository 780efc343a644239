"""Capacity planning in seed 004 section 12's order, every step kept for printing:

1. inputs: TTFT p99 and TPOT p99 targets per tier (with its share of the traffic), peak
   requests/s, prompt and output length distributions, memory for the KV cache;
2. from the tightest TPOT target and the step-cost model, the largest batch (a decode step of
   that many rows, on the average decode context, stays within the target), and the token
   budget per step (a step carrying a prefill chunk may take at most 2x the TPOT target);
3. from memory, the KV capacity (``engine.sim.kv``) and the concurrency it allows;
4. the smaller of 2 and 3 as one instance's batch;
5. instances for the peak: peak req/s x mean output tokens / one instance's decode tokens/s;
6. verification by simulating one instance at its share of the peak (Poisson, tiers by
   share): a TPOT miss shrinks the batch (by a fifth), a TTFT miss adds instances, until
   every tier's p99s hold, or the plan says why they cannot.

A ``constrained`` share of the traffic (structured outputs, tool calls) makes each decode step
pay the cost model's grammar-mask term for that share of its rows, in steps 2 and 5 (the mean
share) and in the simulation of step 6 (that share of the requests carry a grammar).

Targets no configuration can meet are refused before any simulation (``PlanError``): a TPOT
below one request's decode step, a TTFT below one prompt's prefill alone, memory that holds
no request of average length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.core.config import CacheConfig, SchedulerConfig
from engine.sim.cost import CostModel, StepShape
from engine.sim.kv import KvCapacity, kv_capacity
from engine.sim.metrics import TierSummary
from engine.sim.profile import ModelShape
from engine.sim.simulator import EngineShape, Simulator
from engine.sim.workload import Lengths, poisson
from policies.tiers import TIERS

PREFILL_STEP_FACTOR = 2.0  # a step with a prefill chunk may cost this many TPOT targets
MAX_TOKEN_BUDGET = 8192
MAX_ITERATIONS = 30
WINDOW_TTFTS = 30
MAX_SIM_REQUESTS = 4000


class PlanError(ValueError):
    """The targets or inputs cannot be met by any configuration; the message says why."""


@dataclass(frozen=True)
class TierTarget:
    tier: str
    ttft_p99_s: float
    tpot_p99_s: float
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise PlanError(f"unknown tier {self.tier!r} (one of {', '.join(TIERS)})")
        for name in ("ttft_p99_s", "tpot_p99_s", "share"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise PlanError(f"{self.tier}: {name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class PlanInputs:
    targets: tuple[TierTarget, ...]
    peak_rps: float
    prompt: Lengths
    output: Lengths
    kv_memory_gb: float
    shape: ModelShape
    block_size: int = 16
    max_batch: int = 512
    max_instances: int = 1000
    seed: int = 0
    constrained: float = 0.0  # the share of requests whose output a grammar constrains

    def __post_init__(self) -> None:
        if not self.targets:
            raise PlanError("give at least one tier's targets")
        if len({t.tier for t in self.targets}) != len(self.targets):
            raise PlanError("each tier may be given once")
        if not (self.peak_rps > 0 and math.isfinite(self.peak_rps)):
            raise PlanError(f"peak requests/s must be > 0, got {self.peak_rps!r}")
        if not (self.kv_memory_gb > 0 and math.isfinite(self.kv_memory_gb)):
            raise PlanError(f"KV cache memory must be > 0 GB, got {self.kv_memory_gb!r}")
        if not 0.0 <= self.constrained <= 1.0:
            raise PlanError(f"the constrained share must be in [0, 1], got {self.constrained!r}")

    @property
    def shares(self) -> dict[str, float]:
        total = sum(t.share for t in self.targets)
        return {t.tier: t.share / total for t in self.targets}

    @property
    def decode_context(self) -> float:
        """Mean context a decode row reads: the prompt plus half the output, on average."""
        return self.prompt.mean + self.output.mean / 2


@dataclass(frozen=True)
class Check:
    """Step 6: one simulation of one instance at ``rps`` (its share of the peak)."""

    instances: int
    batch: int
    token_budget: int
    rps: float
    tiers: tuple[TierSummary, ...]
    misses: tuple[str, ...]  # "interactive TTFT p99 3.10 s > 2.00 s"
    tpot_missed: bool

    @property
    def ok(self) -> bool:
        return not self.misses


@dataclass
class Plan:
    inputs: PlanInputs
    cost_name: str
    tpot_target: float = 0.0
    tpot_batch: int = 0  # step 2
    tpot_batch_step_s: float = 0.0
    tpot_bounded: bool = True  # False: the cost model never reaches the TPOT target
    kv: KvCapacity | None = None  # step 3
    batch: int = 0  # step 4
    bound: str = ""
    instance_tok_s: float = 0.0  # step 5
    demand_tok_s: float = 0.0
    instances_estimate: int = 0
    checks: list[Check] = field(default_factory=list)  # step 6
    feasible: bool = False
    reason: str = ""
    headroom: float | None = None  # extra load one instance holds, as a fraction of its share

    @property
    def final(self) -> Check | None:
        return self.checks[-1] if self.checks else None

    def serve_flags(self) -> str:
        final = self.final
        assert final is not None and self.kv is not None
        gb = self.inputs.kv_memory_gb
        return (f"carpool serve --max-num-seqs {final.batch} --max-num-batched-tokens "
                f"{final.token_budget} --block-size {self.kv.block_size} "
                f"--kv-cache-memory-gb {gb:g}")


def largest_batch(cost: CostModel, target_s: float, kv_per_row: float, limit: int,
                  constrained: float = 0.0) -> int:
    """The largest row count (<= ``limit``) whose decode step, ``constrained`` of its rows
    masked, stays within ``target_s``."""
    def fits(rows: int) -> bool:
        return cost.decode_seconds(rows, kv_per_row, rows * constrained) <= target_s

    if not fits(1):
        return 0
    lo, hi = 1, limit  # decode_seconds is nondecreasing in rows (coefficients >= 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def token_budget(cost: CostModel, batch: int, kv_per_row: float, tpot_target: float,
                 block_size: int, constrained: float = 0.0) -> int:
    """Decode rows plus the largest prefill chunk whose step stays within
    ``PREFILL_STEP_FACTOR`` TPOT targets (at least one block: prefill must progress)."""
    limit = PREFILL_STEP_FACTOR * tpot_target
    masked = math.ceil(batch * constrained)

    def fits(chunk: int) -> bool:
        kv = batch * kv_per_row + chunk
        return cost.step_seconds(StepShape(batch, batch + chunk, int(kv), 1, masked)) <= limit

    lo, hi = block_size, MAX_TOKEN_BUDGET - batch
    if hi <= lo or not fits(lo):
        return batch + block_size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return batch + lo


def check_feasible(inputs: PlanInputs, cost: CostModel) -> None:
    """Refuse targets no configuration meets (PlanError)."""
    tpot = min(t.tpot_p99_s for t in inputs.targets)
    one = cost.decode_seconds(1, inputs.decode_context, 1.0 if inputs.constrained else 0.0)
    if one > tpot:
        raise PlanError(f"impossible TPOT target: {tpot:g} s per token is below one request's "
                        f"decode step alone ({one:.4f} s on the {cost.name} cost model)")
    ttft = min(t.ttft_p99_s for t in inputs.targets)
    p = inputs.prompt.high
    prefill = cost.step_seconds(StepShape(1, p, p, prefill_rows=1))
    if prefill > ttft:
        raise PlanError(f"impossible TTFT target: {ttft:g} s is below the prefill of one "
                        f"{p}-token prompt alone ({prefill:.3f} s on the {cost.name} cost model)")


def make_plan(inputs: PlanInputs, cost: CostModel) -> Plan:
    """Steps 2-6 (step 1 is ``inputs``); raises PlanError for impossible inputs."""
    check_feasible(inputs, cost)
    plan = Plan(inputs, cost.name)
    kv_row = inputs.decode_context
    plan.tpot_target = min(t.tpot_p99_s for t in inputs.targets)
    plan.tpot_batch = largest_batch(cost, plan.tpot_target, kv_row, inputs.max_batch,
                                    inputs.constrained)
    plan.tpot_bounded = plan.tpot_batch < inputs.max_batch
    plan.tpot_batch_step_s = cost.decode_seconds(plan.tpot_batch, kv_row,
                                                 plan.tpot_batch * inputs.constrained)
    kv = kv_capacity(inputs.kv_memory_gb, inputs.shape, inputs.block_size,
                     inputs.prompt.mean + inputs.output.mean)
    plan.kv = kv
    if kv.concurrency < 1:
        raise PlanError(f"{inputs.kv_memory_gb:g} GB of KV cache is {kv.num_blocks} blocks, fewer "
                        f"than one request of average length needs ({kv.blocks_per_request})")
    plan.batch = min(plan.tpot_batch, kv.concurrency)
    plan.bound = "TPOT" if plan.tpot_batch <= kv.concurrency else "KV memory"
    plan.demand_tok_s = inputs.peak_rps * inputs.output.mean
    plan.instance_tok_s = _decode_tok_s(cost, plan.batch, kv_row, inputs.constrained)
    plan.instances_estimate = max(1, math.ceil(plan.demand_tok_s / plan.instance_tok_s))
    _verify(plan, cost)
    if plan.feasible:
        plan.headroom = _headroom(plan, cost)
    return plan


def _decode_tok_s(cost: CostModel, batch: int, kv_row: float, constrained: float) -> float:
    return batch / cost.decode_seconds(batch, kv_row, batch * constrained)


def _verify(plan: Plan, cost: CostModel) -> None:
    """Step 6: simulate, shrink the batch on a TPOT miss, add instances on a TTFT miss."""
    inputs = plan.inputs
    batch, instances = plan.batch, plan.instances_estimate
    for _ in range(MAX_ITERATIONS):
        if instances > inputs.max_instances:
            plan.reason = f"more than {inputs.max_instances} instances would be needed"
            return
        check = simulate_instance(plan, cost, batch, instances, inputs.peak_rps / instances)
        plan.checks.append(check)
        if check.ok:
            plan.feasible = True
            return
        if check.tpot_missed:
            if batch == 1:
                plan.reason = "TPOT is missed even with one request per step"
                return
            batch = max(1, batch * 4 // 5)
            need = inputs.peak_rps * inputs.output.mean / _decode_tok_s(
                cost, batch, inputs.decode_context, inputs.constrained)
            instances = max(instances, math.ceil(need))
        else:
            instances += max(1, instances // 10)
    plan.reason = f"no configuration met the targets within {MAX_ITERATIONS} simulations"


def simulate_instance(plan: Plan, cost: CostModel, batch: int, instances: int,
                      rps: float) -> Check:
    inputs = plan.inputs
    assert plan.kv is not None
    budget = token_budget(cost, batch, inputs.decode_context, plan.tpot_target,
                          inputs.block_size, inputs.constrained)
    n = simulated_requests(inputs, rps)
    specs = poisson(rps, n, inputs.prompt, inputs.output, inputs.shares, inputs.seed,
                    constrained=inputs.constrained)
    sim = Simulator(cost, SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=budget),
                    CacheConfig(block_size=inputs.block_size),
                    EngineShape(num_blocks=plan.kv.num_blocks))
    result = sim.run(specs)
    tiers = tuple(result.summary(t.tier) for t in inputs.targets)
    misses, tpot_missed = [], False
    # A finite run can hide a slowly growing backlog in a tier with a loose target: an
    # instance offered more tokens/s than it decodes at full batch is overloaded, whatever
    # the run's p99s say.
    offered = rps * inputs.output.mean
    most = _decode_tok_s(cost, batch, inputs.decode_context, inputs.constrained)
    if offered > most:
        misses.append(f"overloaded: {offered:,.1f} tok/s offered > {most:,.1f} tok/s at "
                      f"{batch} rows")
    for target, got in zip(inputs.targets, tiers):
        if not got.ttft_p99 <= target.ttft_p99_s:
            misses.append(f"{target.tier} TTFT p99 {got.ttft_p99:.3f} s > {target.ttft_p99_s:g} s")
        if not got.tpot_p99 <= target.tpot_p99_s:
            misses.append(f"{target.tier} TPOT p99 {got.tpot_p99:.4f} s > {target.tpot_p99_s:g} s")
            tpot_missed = True
    return Check(instances, batch, budget, rps, tiers, tuple(misses), tpot_missed)


def simulated_requests(inputs: PlanInputs, rps: float) -> int:
    """Arrivals over a window of at least ``WINDOW_TTFTS`` tightest TTFT targets (and a
    minute): an overloaded instance's backlog then grows past the TTFT target within the run
    instead of hiding in a short one; at least 200 requests in the smallest tier's share."""
    window = max(60.0, WINDOW_TTFTS * min(t.ttft_p99_s for t in inputs.targets))
    floor = math.ceil(200 / min(inputs.shares.values()))
    return min(MAX_SIM_REQUESTS, max(floor, math.ceil(rps * window)))


def _headroom(plan: Plan, cost: CostModel, top: float = 4.0, rounds: int = 5) -> float:
    """How much more than its share one instance takes before a target breaks (bisection on
    the load factor in [1, ``top``]); ``top - 1`` means at least that much."""
    final = plan.final
    assert final is not None
    if simulate_instance(plan, cost, final.batch, final.instances, final.rps * top).ok:
        return top - 1
    lo, hi = 1.0, top
    for _ in range(rounds):
        mid = (lo + hi) / 2
        ok = simulate_instance(plan, cost, final.batch, final.instances, final.rps * mid).ok
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo - 1
