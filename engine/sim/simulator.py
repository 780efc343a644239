"""The simulation loop: the engine's own ``Scheduler`` (and through it the ``BlockManager``, the
batching policies, priorities, preemption, chunked prefill) on a ``VirtualClock``; only the
runner is a stand-in.

One simulated step is the engine's three calls with the forward pass replaced::

    admit the arrivals due by now          (the engine's add_request)
    out = scheduler.schedule()
    clock.advance(cost.step_seconds(shape_of(out)))
    scheduler.update_from_output(out, {one token per row that samples})

A token is stamped at the end of the step that produced it, as in the engine. The runner
never emits EOS, so a request produces exactly its ``output_len`` tokens (the engine with
``ignore_eos``). A constrained request (``RequestSpec.constrained``) carries a grammar in its
sampling params, as in the engine, so ``shape_of`` counts it among the step's constrained rows
whenever it samples and the cost model charges its mask; no grammar is compiled or applied
(the stand-in token is not checked against it). With nothing to run, the clock jumps to the next event: an arrival, or the
moment dynamic batching's ``max_wait_ms`` lets a waiting batch start.

``run(..., refill=iter, keep_waiting=k, until_tokens=n)`` models a queue that never runs dry
(seed 000's "the queue keeps every seat full"): before each step the queue is topped up to
``k`` waiting requests from ``refill`` (arriving now), and the run stops once ``n`` tokens
were produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.structured import StructuredSpec
from engine.sim.clock import VirtualClock
from engine.sim.cost import CostModel, shape_of
from engine.sim.metrics import RequestRecord, RunResult, StepRecord
from engine.sim.workload import SIM_ANSWER, RequestSpec

SIM_TOKEN = SIM_ANSWER  # what the stand-in runner "samples"; never an EOS (none is set)
_SYNTHETIC_BASE = 1 << 20  # synthetic prompts start with a per-request token: no false sharing
SIM_GRAMMAR = StructuredSpec("json_object", "")  # marks a constrained row; never compiled here


@dataclass(frozen=True)
class EngineShape:
    """The engine knobs a simulation needs beyond the scheduler's own config."""

    num_blocks: int = 1 << 16
    num_cpu_blocks: int = 0
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.num_cpu_blocks < 0:
            raise ValueError("need num_blocks >= 1 and num_cpu_blocks >= 0")


class Simulator:
    def __init__(self, cost: CostModel, scheduler: SchedulerConfig | None = None,
                 cache: CacheConfig | None = None, shape: EngineShape | None = None) -> None:
        self.cost = cost
        self.scheduler_config = scheduler or SchedulerConfig()
        self.cache_config = cache or CacheConfig()
        self.shape = shape or EngineShape()

    def run(self, workload: Iterable[RequestSpec], *, refill: Iterator[RequestSpec] | None = None,
            keep_waiting: int = 0, until_tokens: int | None = None,
            max_steps: int = 5_000_000) -> RunResult:
        return _Run(self, workload, refill, keep_waiting, until_tokens).loop(max_steps)

    def instance(self) -> _Run:
        """An empty run to feed arrivals (``pending``, in arrival order) and ``advance``
        step by step: one instance of a simulated fleet (``engine/sim/fleet.py``)."""
        return _Run(self, (), None, 0, None)


class _Run:
    """One simulation's state (a fresh scheduler per run: runs never share KV blocks)."""

    def __init__(self, sim: Simulator, workload: Iterable[RequestSpec],
                 refill: Iterator[RequestSpec] | None, keep_waiting: int,
                 until_tokens: int | None) -> None:
        self.clock = VirtualClock()
        self.cost = sim.cost
        self.config = sim.scheduler_config
        self.scheduler = Scheduler(sim.scheduler_config, sim.cache_config,
                                   sim.shape.num_blocks, sim.shape.num_cpu_blocks,
                                   sim.shape.max_model_len, clock=self.clock)
        self.pending = sorted(workload, key=lambda s: s.arrival)  # stable: FCFS at a tie
        self.next_pending = 0
        self.refill, self.keep_waiting, self.until_tokens = refill, keep_waiting, until_tokens
        self.specs: dict[str, RequestSpec] = {}
        self.result = RunResult()
        self.tokens = 0

    def loop(self, max_steps: int) -> RunResult:
        sched = self.scheduler
        for _ in range(max_steps):
            self._admit_arrivals()
            if not sched.has_unfinished_requests():
                if self.next_pending >= len(self.pending):
                    break
                self.clock.jump(self.pending[self.next_pending].arrival)
                continue
            self._schedule_and_step()
            if self.until_tokens is not None and self.tokens >= self.until_tokens:
                break
        else:
            raise RuntimeError(f"simulation did not finish within {max_steps} steps")
        stats = sched.stats
        self.result.end_time = self.clock.now
        self.result.preemptions = stats.preemptions_recompute + stats.preemptions_swap
        return self.result

    def advance(self, until: float) -> None:
        """Run the steps that start before ``until`` (the fleet simulation's instances, fed
        their arrivals as they come: ``engine/sim/fleet.py``); idle, the clock stays put."""
        sched = self.scheduler
        while True:
            self._admit_arrivals()
            if not sched.has_unfinished_requests():
                if self.next_pending >= len(self.pending) \
                        or self.pending[self.next_pending].arrival >= until:
                    return
                self.clock.jump(self.pending[self.next_pending].arrival)
                continue
            if self.clock.now >= until:
                return
            self._schedule_and_step()

    def _schedule_and_step(self) -> None:
        """One scheduler round: a step of what it scheduled, or an idle tick when nothing."""
        out = self.scheduler.schedule()
        if not (out.scheduled or out.swap_in or out.swap_out):
            self._collect(self.scheduler.update_from_output(out, ModelRunnerOutput()))
            self._idle()
            return
        self._step(out)

    def _step(self, out: SchedulerOutput) -> None:
        shape = shape_of(out)
        start = self.clock.now
        seconds = self.cost.step_seconds(shape)
        self.clock.advance(seconds)
        sampled = {s.request_id: SIM_TOKEN for s in out.scheduled if s.sample}
        self.tokens += len(sampled)
        sched = self.scheduler
        self.result.steps.append(StepRecord(
            start, seconds, shape.rows, shape.tokens, shape.kv_tokens, len(sched.running),
            len(sched.waiting), tuple(s.request_id for s in out.scheduled)))
        self._collect(sched.update_from_output(out, ModelRunnerOutput(sampled)))

    def _idle(self) -> None:
        """Nothing could run: jump to the next arrival or batching deadline."""
        events = []
        if self.next_pending < len(self.pending):
            events.append(self.pending[self.next_pending].arrival)
        oldest = self.scheduler.waiting.oldest_arrival()
        if oldest is not None and self.config.batching == "dynamic":
            events.append(oldest + self.config.max_wait_ms / 1e3)
        later = [t for t in events if t > self.clock.now]
        if not later:
            raise RuntimeError("simulation stalled: requests wait but no event can start them")
        self.clock.jump(min(later))

    def _admit_arrivals(self) -> None:
        now = self.clock.now
        while self.next_pending < len(self.pending) and self.pending[self.next_pending].arrival <= now:
            self._add(self.pending[self.next_pending])
            self.next_pending += 1
        if self.refill is not None:
            while len(self.scheduler.waiting) < self.keep_waiting:
                spec = next(self.refill, None)
                if spec is None:
                    self.refill = None
                    break
                self._add(RequestSpec(spec.request_id, spec.output_len, spec.prompt_len, now,
                                      spec.tier, spec.tenant, spec.prompt_ids,
                                      spec.constrained))

    def _add(self, spec: RequestSpec) -> None:
        if spec.request_id in self.specs:
            raise ValueError(f"duplicate request id {spec.request_id!r} in the workload")
        ids = list(spec.prompt_ids) or _synthetic_prompt(len(self.specs), spec.prompt_len)
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True,
                                structured=SIM_GRAMMAR if spec.constrained else None)
        self.specs[spec.request_id] = spec
        self.scheduler.add_request(Request(spec.request_id, ids, params, spec.priority,
                                           spec.arrival))

    def _collect(self, changed: list[Request]) -> None:
        for req in changed:
            if not req.is_finished:
                continue
            spec = self.specs[req.request_id]
            reason = req.status.finish_reason
            self.result.requests.append(RequestRecord(
                req.request_id, spec.tier, spec.tenant, req.arrival_time, req.times.first_token,
                req.times.finished if req.times.finished is not None else self.clock.now,
                req.num_output_tokens, None if reason is None else reason.value,
                req.num_preemptions, req.num_cached_tokens))


def _synthetic_prompt(index: int, length: int) -> list[int]:
    return [_SYNTHETIC_BASE + index] + [1 + (index + j) % 1000 for j in range(1, length)]
