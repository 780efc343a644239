"""Simulator against the real engine, same workloads, side by side (issue 13's validation).

    flock /tmp/carpool-bench.lock python -m engine.bench.sim_vs_real [--slots 16] [--profile P]

1. Calibrate: time the engine on a small grid of batch shapes and a short served run (random
   lengths arriving into the full batch) in this process, just before the runs (or load
   ``--profile``), and fit the calibrated step-cost model.
2. Seed workload: 100 requests alternating 20 and 200 output tokens (``ignore_eos``), short
   prompts, all at t=0 (``engine.bench.engine``'s workload).
3. Poisson workload: ``--poisson-n`` requests at ``--rate`` req/s (default: 60% of the
   calibrated decode capacity), prompts 16..128 random tokens, outputs 16..64.

Each runs in the real engine (SmolLM2, wall clock: requests are added at their arrival times
between steps) and in the simulator (the same prompts and lengths, the calibrated cost).
Printed: throughput, mean latency, p99 TTFT (targets: within 10%, 10%, 25%), and more; beside
them the simulator replaying the real run's own step times (the scheduler model without the
cost model's error), the cost model scored on the real steps (its error alone), and the law
refitted on one run's real steps and scored on the other's (the functional form, held out).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from engine.bench.calibrate import calibrate, cpu_name
from engine.bench.engine import make_workload
from engine.core.outputs import SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.sim.cost import CalibratedCost, CostModel, ReplayCost, StepShape, shape_of
from engine.sim.metrics import RequestRecord, RunResult, StepRecord, mean, percentile
from engine.sim.profile import Profile, Sample, fit
from engine.sim.report import table
from engine.sim.simulator import EngineShape, Simulator
from engine.sim.workload import Lengths, RequestSpec

TARGETS = {"throughput": 0.10, "mean latency": 0.10, "TTFT p99": 0.25}


def run_real(engine: LLMEngine, specs: list[RequestSpec]) -> tuple[RunResult, list[Sample]]:
    """Drive the engine on the wall clock: arrivals are added between steps when due. The
    steps' shapes and times are kept (``StepRecord``, and as profile samples) to score the
    cost model on its own."""
    pending = sorted(specs, key=lambda s: s.arrival)
    samples: list[Sample] = []

    def observe(out: SchedulerOutput, seconds: float) -> None:
        sh = shape_of(out)
        samples.append((sh.rows, sh.tokens, sh.kv_tokens, sh.prefill_rows, sh.constrained_rows,
                        seconds))

    engine.step_observers.append(observe)
    try:
        result = _drive(engine, pending)
    finally:
        engine.step_observers.remove(observe)
    result.steps = [StepRecord(0.0, s, r, t, kv, 0, 0, ()) for r, t, kv, _, _, s in samples]
    return result, samples


def _drive(engine: LLMEngine, pending: list[RequestSpec]) -> RunResult:
    tiers = {s.request_id: s.tier for s in pending}
    result = RunResult()
    t0 = time.monotonic()
    while pending or engine.has_unfinished_requests():
        now = time.monotonic() - t0
        while pending and pending[0].arrival <= now:
            s = pending.pop(0)
            engine.add_request(list(s.prompt_ids), SamplingParams(max_tokens=s.output_len,
                                                                  ignore_eos=True),
                               request_id=s.request_id, arrival_time=t0 + s.arrival)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival - (time.monotonic() - t0)))
            continue
        for out in engine.step():
            if out.finished:
                result.requests.append(RequestRecord(
                    out.request_id, tiers[out.request_id], "default", out.arrival_time - t0,
                    None if out.first_token_time is None else out.first_token_time - t0,
                    (out.finish_time or time.monotonic()) - t0, out.num_output_tokens,
                    out.finish_reason, out.num_preemptions))
    return result


def run_sim(engine: LLMEngine, cost: CostModel, specs: list[RequestSpec]) -> RunResult:
    c = engine.config
    sim = Simulator(cost, c.scheduler, c.cache,
                    EngineShape(engine.runner.num_blocks, engine.runner.num_cpu_blocks,
                                engine.max_model_len))
    return sim.run(specs)


def seed_specs(engine: LLMEngine, n: int) -> list[RequestSpec]:
    wl = make_workload(engine.tokenizer, n, 20, 200)
    return [RequestSpec(f"s{i}", out, len(p), 0.0, prompt_ids=tuple(p))
            for i, (p, out) in enumerate(zip(wl.prompts, wl.output_lens))]


def poisson_specs(engine: LLMEngine, n: int, rate: float, seed: int = 0) -> list[RequestSpec]:
    rng = random.Random(seed)
    prompt, output = Lengths(16, 128), Lengths(16, 64)
    vocab = engine.runner.args.vocab_size
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        p = prompt.draw(rng)
        out.append(RequestSpec(f"p{i}", output.draw(rng), p, t,
                               prompt_ids=tuple(rng.randrange(100, vocab) for _ in range(p))))
    return out


def figures(r: RunResult) -> dict[str, float]:
    ttft = [x.ttft for x in r.requests if x.ttft is not None]
    lat = [x.latency for x in r.requests]
    return {"throughput": r.throughput, "mean latency": mean(lat),
            "TTFT p99": percentile(ttft, 99), "TTFT mean": mean(ttft),
            "latency p50": percentile(lat, 50), "latency p99": percentile(lat, 99),
            "makespan": r.makespan}


def busy_error(cost: CostModel, steps: Sequence[Sample]) -> tuple[float, float]:
    """The cost model alone on measured steps: (predicted, measured) busy seconds."""
    return (sum(cost.step_seconds(StepShape(r, t, kv, p, c)) for r, t, kv, p, c, _ in steps),
            sum(s for *_, s in steps))


def cost_error(cost: CostModel, steps: Sequence[Sample], window: int = 80) -> str:
    """Busy time, then measured/predicted per step: the median is the law's error on a
    typical step; the spread over windows of consecutive steps is the machine's load
    changing under the run (the same shapes, slower or faster for a minute)."""
    predicted, measured = busy_error(cost, steps)
    ratios = [s / cost.step_seconds(StepShape(r, t, kv, p, c)) for r, t, kv, p, c, s in steps]
    spans = [sum(x[-1] for x in steps[i:i + window])
             / busy_error(cost, steps[i:i + window])[0] for i in range(0, len(steps), window)]
    return (f"cost model on this run's {len(steps)} real steps: predicted {predicted:.1f} s "
            f"of {measured:.1f} s measured ({predicted / measured - 1:+.1%}); measured/predicted"
            f" per step: median {percentile(ratios, 50):.2f}, over {window}-step windows "
            f"{min(spans):.2f}..{max(spans):.2f}")


def held_out(runs: dict[str, list[Sample]]) -> list[str]:
    """The law fitted on one run's real steps, scored on the other's (no engine time): does
    the functional form carry from one workload to another on this machine?"""
    lines = []
    for fit_on, steps in runs.items():
        law = fit(steps)
        for score_on, other in runs.items():
            if score_on != fit_on:
                predicted, measured = busy_error(CalibratedCost(law), other)
                lines.append(f"law fitted on the {fit_on} run's steps, scored on the {score_on} "
                             f"run's: {predicted:.1f} s of {measured:.1f} s "
                             f"({predicted / measured - 1:+.1%})")
    return lines


def compare(name: str, real: RunResult, sim: RunResult, replay: RunResult) -> tuple[str, bool]:
    """Real, simulated with the calibrated cost (the targets apply to its error), and
    simulated with the real run's own step times replayed (the scheduler model alone)."""
    fr, fs, fp = figures(real), figures(sim), figures(replay)
    rows, ok = [], True
    for key in fr:
        err, err_replay = (fs[key] - fr[key]) / fr[key], (fp[key] - fr[key]) / fr[key]
        target = TARGETS.get(key)
        verdict = "" if target is None else ("ok" if abs(err) <= target else "MISS")
        ok = ok and verdict != "MISS"
        unit = " tok/s" if key == "throughput" else " s"
        rows.append([key, f"{fr[key]:.3f}{unit}", f"{fs[key]:.3f}{unit}", f"{err:+.1%}",
                     "" if target is None else f"<= {target:.0%} {verdict}",
                     f"{fp[key]:.3f}{unit}", f"{err_replay:+.1%}"])
    head = f"{name}: {len(real.requests)} requests, {real.output_tokens} output tokens"
    return head + "\n" + table(["figure", "real engine", "sim (calibrated)", "error", "target",
                                "sim (replayed steps)", "error"], rows), ok


def validate(name: str, engine: LLMEngine, cost: CostModel,
             specs: list[RequestSpec]) -> tuple[list[str], bool, list[Sample]]:
    real, steps = run_real(engine, specs)
    sim = run_sim(engine, cost, specs)
    replay = run_sim(engine, ReplayCost([s.seconds for s in real.steps]), specs)
    text, ok = compare(name, real, sim, replay)
    return ["", text, cost_error(cost, steps)], ok, steps


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.sim_vs_real", description=__doc__)
    p.add_argument("--slots", type=int, default=16, help="max_num_seqs")
    p.add_argument("--n", type=int, default=100, help="seed workload requests")
    p.add_argument("--poisson-n", type=int, default=40)
    p.add_argument("--rate", type=float, default=None, help="Poisson req/s (default: 60%% of capacity)")
    p.add_argument("--profile", default=None, help="use this profile instead of calibrating now")
    p.add_argument("--save-profile", default=None, help="write the profile calibrated now here")
    p.add_argument("--mixed-requests", type=int, default=32, help="the calibration's served run")
    p.add_argument("--save-steps", default=None,
                   help="write the real runs' steps (rows, tokens, kv, prefill rows, s) as JSON")
    args = p.parse_args(argv)
    engine = LLMEngine.from_kwargs(dtype="float32", max_num_seqs=args.slots)
    if args.profile:
        profile = Profile.load(args.profile)
    else:
        # The shapes these workloads reach: 1..slots rows, contexts up to ~230 tokens.
        rows = sorted({1, 4, args.slots})
        profile = calibrate(engine, mixed_requests=args.mixed_requests, rows_grid=rows,
                            prompt_grid=(8, 160), decode_steps=8, max_prefill_tokens=4096)
    if args.save_profile:
        profile.save(args.save_profile)
    cost = profile.cost_model()
    c, (med, p90) = profile.cost, profile.fit_error()
    # the 1-minute load average at the start says whether the machine was shared (2 cores)
    lines = [(f"machine: {cpu_name()} (load average {os.getloadavg()[0]:.1f}), model "
              f"{engine.model_name}, {args.slots} slots"),
             (f"calibrated: step s = {c.base:.4f} + {c.per_row:.2e} rows + {c.per_token:.2e} tokens"
             f" + {c.per_kv_token:.2e} kv + {c.per_prefill_row:.2e} prefill rows; fit error on "
             f"{len(profile.samples)} steps: median {med:.1%}, p90 {p90:.1%}")]
    seed = seed_specs(engine, args.n)
    text, ok1, seed_steps = validate("seed workload (20/200 alternating, all at t=0)", engine,
                                     cost, seed)
    lines += text
    rate = args.rate or 0.6 * args.slots / cost.decode_seconds(args.slots, 96) / 40
    pois = poisson_specs(engine, args.poisson_n, rate)
    text, ok2, pois_steps = validate(
        f"Poisson workload ({rate:.2f} req/s, prompts 16..128, outputs 16..64)", engine, cost, pois)
    lines += [*text, "", *held_out({"seed": seed_steps, "Poisson": pois_steps})]
    if args.save_steps:
        Path(args.save_steps).write_text(json.dumps({"calibration": profile.samples,
                                                     "seed": seed_steps, "Poisson": pois_steps}))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
