"""The doctor: which of seed 004's six symptoms of batching gone wrong (section 13) hold now.

Input is one ``DoctorSnapshot``: the deployment's numbers over a rolling window, built from the
same metrics Prometheus exports (``gateway/telemetry/stats_snapshot.py``). Each rule is a pure
function of that snapshot returning a ``Finding`` (the symptom, its evidence numbers, the cause
and the knob to turn) or None; every threshold is a field of ``Thresholds``, in this one place.
Counts (``completed``, ``preempt_recompute``...) are over the window; ``*_avg`` gauges are
averages of the 1 s samples in it.

    symptom (seed 004 §13)                  rule                       evidence
    throughput up, P99 worse                batch_wait_tail            TTFT tail + preemption or queue wait
    long prompts stall everyone             prefill_stalls             TPOT tail + prefill-heavy steps
    high utilisation, no throughput gain    recompute_churn            recompute preemptions per request
    short requests spike at random          long_outputs_hold_slots    seats full, KV to spare, TTFT tail
    memory free but concurrency capped      memory_free_capped         queue in the engine beside free
                                                                       seats and KV, or swap thrash
    KV not released after disconnects       kv_not_released            blocks held by an idle engine

and one of the TTFT objective (seed 004 §11, distributions by queue): a tier's TTFT p99 past
its target, naming the part of the TTFT budget (``policies.ttft_split``) that took the most
(``ttft_over_objective``).

Imports nothing from ``engine/`` or ``gateway/``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from policies.ttft_split import LABELS, largest_part


@dataclass(frozen=True)
class Thresholds:
    min_requests: int = 5  # completions in the window before a latency tail means anything
    tail_ratio: float = 4.0  # p99 >= this x p50 is a tail
    ttft_floor_s: float = 0.5  # a TTFT p99 under this is never a symptom
    tpot_floor_s: float = 0.05  # nor a TPOT p99 under this
    queue_share: float = 0.5  # queue wait p99 >= this share of TTFT p99: batch wait dominates
    min_preemptions: int = 3  # in the window, before churn is churn
    churn_per_request: float = 0.5  # recompute preemptions per finished request
    seats_full: float = 0.9  # running avg >= this x max_num_seqs: every seat taken
    kv_room: float = 0.3  # free KV fraction above this: memory to spare
    waiting_min: float = 1.0  # requests waiting inside the engine, on average
    prefill_step_ratio: float = 8.0  # step tokens p99 >= this x batch size p99: prefill steps
    swap_thrash_per_request: float = 4.0  # blocks swapped in AND out per finished request
    min_swap_blocks: int = 16  # in each direction, in the window
    idle_leak_s: float = 3.0  # an idle engine holding KV blocks this long has leaked them


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class TierWindow:
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    queue_wait_p99_s: float | None = None
    completed: float = 0.0  # requests ended naturally (stop/length) in the window
    ttft_target_s: float | None = None  # the tier's TTFT objective (p99), if it has one
    # the TTFT budget: each part's p99 (``policies.ttft_split``), and steps to the first token
    ttft_parts_p99_s: Mapping[str, float | None] = field(default_factory=dict)
    ttft_steps_p99: float | None = None


@dataclass(frozen=True)
class EngineWindow:
    max_num_seqs: int = 0  # summed over workers; 0 unknown
    running_avg: float = 0.0
    waiting_avg: float = 0.0
    swapped_avg: float = 0.0
    kv_total: int = 0  # device blocks, summed over workers
    kv_used_avg: float = 0.0
    batch_p99: float | None = None  # rows per step
    step_tokens_p99: float | None = None
    preempt_recompute: float = 0.0
    preempt_swap: float = 0.0
    swap_in_blocks: float = 0.0
    swap_out_blocks: float = 0.0
    finished: float = 0.0  # requests the gateway saw end, any reason
    aborts: float = 0.0
    idle_s: float = 0.0  # how long the engine has had no request at all (trailing)
    idle_kv_used: int = 0  # fewest blocks used during that idle stretch

    @property
    def kv_free_fraction(self) -> float:
        return 1.0 - self.kv_used_avg / self.kv_total if self.kv_total else 0.0


@dataclass(frozen=True)
class DoctorSnapshot:
    window_s: float
    tiers: Mapping[str, TierWindow] = field(default_factory=dict)
    engine: EngineWindow | None = None


@dataclass(frozen=True)
class Finding:
    symptom: str  # the rule's name
    title: str  # seed 004's words for it
    cause: str
    knob: str
    evidence: dict[str, float | str]


Rule = Callable[[DoctorSnapshot, Thresholds], Finding | None]


def _tail(p50: float | None, p99: float | None, floor: float, t: Thresholds) -> bool:
    return p50 is not None and p99 is not None and p99 >= floor and p99 >= t.tail_ratio * p50


def _ttft_tails(s: DoctorSnapshot, t: Thresholds) -> list[tuple[str, TierWindow]]:
    return [(name, w) for name, w in sorted(s.tiers.items())
            if w.completed >= t.min_requests and _tail(w.ttft_p50_s, w.ttft_p99_s,
                                                       t.ttft_floor_s, t)]


def _r(x: float | None) -> float | str:
    return "n/a" if x is None else round(x, 4)


def batch_wait_tail(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    e = s.engine
    preempted = (e.preempt_recompute + e.preempt_swap) if e is not None else 0.0
    for name, w in _ttft_tails(s, t):
        assert w.ttft_p99_s is not None
        waited = w.queue_wait_p99_s is not None and w.queue_wait_p99_s >= t.queue_share * w.ttft_p99_s
        if preempted >= t.min_preemptions or waited:
            return Finding(
                "batch_wait_tail", "Throughput up but P99 latency worse",
                "requests wait for a batch to form and running ones are preempted",
                "lower max_wait_ms and the batch cap (--max-num-seqs); keep latency-bound "
                "traffic on the interactive tier",
                {"tier": name, "ttft_p50_s": _r(w.ttft_p50_s), "ttft_p99_s": _r(w.ttft_p99_s),
                 "queue_wait_p99_s": _r(w.queue_wait_p99_s), "preemptions": preempted})
    return None


def prefill_stalls(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    e = s.engine
    if e is None or e.step_tokens_p99 is None or not e.batch_p99:
        return None
    if e.step_tokens_p99 < t.prefill_step_ratio * e.batch_p99:
        return None
    for name, w in sorted(s.tiers.items()):
        if w.completed >= t.min_requests and _tail(w.tpot_p50_s, w.tpot_p99_s,
                                                   t.tpot_floor_s, t):
            return Finding(
                "prefill_stalls", "A long prompt arrives and everyone stalls",
                "whole prefills run in the same steps as decodes (prefill not chunked, or "
                "the token budget per step is too large)",
                "chunk prefill: lower --max-num-batched-tokens so a prompt is spread over steps",
                {"tier": name, "tpot_p50_s": _r(w.tpot_p50_s), "tpot_p99_s": _r(w.tpot_p99_s),
                 "step_tokens_p99": _r(e.step_tokens_p99), "batch_size_p99": _r(e.batch_p99)})
    return None


def recompute_churn(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    e = s.engine
    if e is None or e.preempt_recompute < t.min_preemptions:
        return None
    per_request = e.preempt_recompute / max(e.finished, 1.0)
    if per_request < t.churn_per_request:
        return None
    return Finding(
        "recompute_churn", "High utilisation but no throughput gain",
        "preempted requests recompute their prompts: the KV pool is too small for the batch",
        "more KV blocks (--num-blocks / --kv-cache-memory-gb), fewer seats (--max-num-seqs), "
        "or --preemption-mode swap",
        {"recompute_preemptions": e.preempt_recompute, "finished": e.finished,
         "preemptions_per_request": round(per_request, 3),
         "kv_used_fraction": round(1.0 - e.kv_free_fraction, 3) if e.kv_total else "n/a"})


def long_outputs_hold_slots(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    e = s.engine
    if e is None or not e.max_num_seqs or e.preempt_recompute + e.preempt_swap > 0:
        return None
    if e.running_avg < t.seats_full * e.max_num_seqs or e.waiting_avg < t.waiting_min:
        return None
    if e.kv_free_fraction < t.kv_room:
        return None
    tails = _ttft_tails(s, t)
    if not tails:
        return None
    name, w = tails[0]
    return Finding(
        "long_outputs_hold_slots", "Short requests spike at random",
        "every seat is held by long generations while KV memory is free",
        "cap max_tokens per tenant/tier (max_max_tokens), send long generations to the batch "
        "tier, or add seats (--max-num-seqs) since KV has room",
        {"tier": name, "ttft_p50_s": _r(w.ttft_p50_s), "ttft_p99_s": _r(w.ttft_p99_s),
         "running_avg": round(e.running_avg, 2), "max_num_seqs": e.max_num_seqs,
         "waiting_avg": round(e.waiting_avg, 2), "kv_free_fraction": round(e.kv_free_fraction, 3)})


def memory_free_capped(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    e = s.engine
    if e is None:
        return None
    evidence: dict[str, float | str] = {
        "waiting_avg": round(e.waiting_avg, 2), "running_avg": round(e.running_avg, 2),
        "max_num_seqs": e.max_num_seqs, "kv_free_fraction": round(e.kv_free_fraction, 3),
        "swap_in_blocks": e.swap_in_blocks, "swap_out_blocks": e.swap_out_blocks}
    held_back = (e.max_num_seqs > 0 and e.waiting_avg >= t.waiting_min
                 and e.running_avg < t.seats_full * e.max_num_seqs
                 and e.kv_total > 0 and e.kv_free_fraction >= t.kv_room)
    thrash_blocks = min(e.swap_in_blocks, e.swap_out_blocks)
    thrash = (thrash_blocks >= t.min_swap_blocks
              and thrash_blocks >= t.swap_thrash_per_request * max(e.finished, 1.0))
    if not (held_back or thrash):
        return None
    return Finding(
        "memory_free_capped", "Memory free but concurrency capped",
        "swap thrash" if thrash else "requests wait beside free seats and free KV blocks: "
        "block granularity, fragmentation or the per-step token budget hold them back",
        "check --block-size (smaller blocks waste less), the CPU swap space "
        "(num_cpu_blocks / swap_space_gb) and --max-num-batched-tokens",
        evidence)


def kv_not_released(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    e = s.engine
    if e is None or e.idle_s < t.idle_leak_s or e.idle_kv_used <= 0:
        return None
    return Finding(
        "kv_not_released", "KV memory not released after users disconnect",
        "the engine runs nothing yet holds KV blocks: a cancellation did not reach the "
        "scheduler's abort path",
        "make the abort path free the request's KV blocks (engine abort at the step boundary); "
        "compare carpool_aborts with the engine's aborts",
        {"idle_s": round(e.idle_s, 1), "kv_blocks_held": e.idle_kv_used,
         "kv_total": e.kv_total, "aborts": e.aborts})


# what to turn when a part of the TTFT budget is the largest (``policies.ttft_split.PARTS``)
PART_KNOBS = {
    "gateway_in": "the gateway's own work (auth, parsing, tokenizing): more gateway processes "
                  "(--role gateway) or a faster tokenizer",
    "redis_queue": "requests wait in Redis for a seat: more workers, a larger interactive share "
                   "(CARPOOL_TIER_WEIGHTS), or shed (--tier-slos 'interactive=...,shed')",
    "drainer_to_engine": "the worker's claim and hand-off: check Redis latency (carpool bench "
                         "gateway) and the worker's event loop",
    "step_wait": "the step in flight and steps sat out in the engine: shorter steps, a lower "
                 "interactive TPOT budget (--tpot-budget) caps the rows beside interactive",
    "prefill": "its prompt takes several steps: raise --max-num-batched-tokens or shorten prompts",
    "first_token_out": "the way back (the worker's write, Redis, the gateway's output mux): check "
                       "Redis latency and the gateway's event loop",
}


def ttft_over_objective(s: DoctorSnapshot, t: Thresholds) -> Finding | None:
    """A tier's TTFT p99 past its objective, with the part of the TTFT budget that took most."""
    for name, w in sorted(s.tiers.items()):
        target, p99 = w.ttft_target_s, w.ttft_p99_s
        if target is None or p99 is None or w.completed < t.min_requests or p99 <= target:
            continue
        part = largest_part(w.ttft_parts_p99_s)
        evidence: dict[str, float | str] = {
            "tier": name, "ttft_p99_s": _r(p99), "ttft_target_s": _r(target),
            "largest_part": part or "n/a", "steps_p99": _r(w.ttft_steps_p99)}
        evidence.update({f"{k}_p99_s": _r(v) for k, v in w.ttft_parts_p99_s.items()})
        return Finding(
            "ttft_over_objective", f"{name} TTFT over its objective",
            f"the largest part of its TTFT p99 is {LABELS.get(part or '', 'not known')}",
            PART_KNOBS.get(part or "", "the TTFT budget needs a worker that sends its marks"),
            evidence)
    return None


RULES: tuple[Rule, ...] = (batch_wait_tail, prefill_stalls, recompute_churn,
                           long_outputs_hold_slots, memory_free_capped, kv_not_released,
                           ttft_over_objective)


def diagnose(s: DoctorSnapshot, t: Thresholds = DEFAULT_THRESHOLDS) -> list[Finding]:
    """Every symptom that holds now, in seed 004's order; empty when healthy."""
    return [f for rule in RULES if (f := rule(s, t)) is not None]
