"""`carpool simulate`: run a workload through the engine's own scheduler on a virtual clock
(``engine.sim``); no model, no torch.

    carpool simulate seed000                       seed 000's two tables, by simulation
    carpool simulate poisson --rate 4 --n 400 --prompt 32:256 --output 16:128 \
        --tiers interactive=0.7,batch=0.3 --profile P.json --max-num-seqs 32 [--plot DIR]
    carpool simulate at-once --n 100 --output 20,200 --step-ms 50 --max-num-seqs 4
    carpool simulate trace requests.jsonl --profile P.json

The step cost is ``--step-ms`` (fixed) or a calibrated profile (``--profile``, default the
one ``carpool calibrate`` wrote for the bundled model).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine.sim imports are lazy: building the CLI parser stays cheap
    from engine.sim import seed000


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate a workload on the real scheduler (no model)")
    configure(p)
    p.set_defaults(func=run)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", choices=("seed000", "poisson", "at-once", "trace"))
    p.add_argument("trace", nargs="?", default=None, help="trace: a JSONL file")
    p.add_argument("--n", type=int, default=200, help="requests (poisson, at-once)")
    p.add_argument("--rate", type=float, default=2.0, help="poisson: requests/s")
    p.add_argument("--prompt", default="64", help="prompt tokens: N or LOW:HIGH")
    p.add_argument("--output", default="64",
                   help="output tokens: N or LOW:HIGH; at-once: a comma list cycled (20,200)")
    p.add_argument("--tiers", default="interactive=1", help="tier shares, e.g. interactive=0.7,batch=0.3")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--constrained", type=float, default=0.0,
                   help="poisson: share of requests with structured outputs or tools (0..1)")
    add_engine_flags(p)
    p.add_argument("--plot", default=None, help="write PNG plots to this folder (matplotlib)")


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine and cost model")
    g.add_argument("--step-ms", type=float, default=None, help="fixed step cost (else --profile)")
    g.add_argument("--profile", default=None, help="calibrated profile JSON (carpool calibrate)")
    g.add_argument("--batching", choices=("continuous", "static", "dynamic"), default="continuous")
    g.add_argument("--max-wait-ms", type=float, default=50.0)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--num-blocks", type=int, default=1 << 16)
    g.add_argument("--block-size", type=int, default=16)


def run(args: argparse.Namespace) -> int:
    try:
        if args.workload == "seed000":
            sys.stdout.write(seed000_report() + "\n")
            return 0
        sys.stdout.write(_simulate(args) + "\n")
        return 0
    except (ValueError, OSError) as e:
        sys.stderr.write(f"carpool simulate: {e}\n")
        return 2


def cost_model(step_ms: float | None, profile: str | None) -> Any:
    from engine.sim.cost import FixedCost
    from engine.sim.profile import Profile, default_profile_path

    if step_ms is not None:
        return FixedCost(step_ms / 1e3)
    return Profile.load(profile or default_profile_path()).cost_model()


def tier_shares(raw: str) -> dict[str, float]:
    out = {}
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            out[name.strip()] = float(value) if sep else 1.0
        except ValueError:
            raise ValueError(f"tier share {part!r}: expected <tier>=<share>") from None
    return out


def _simulate(args: argparse.Namespace) -> str:
    from engine.core.config import CacheConfig, SchedulerConfig
    from engine.sim import workload as wl
    from engine.sim.report import run_overview, tier_table
    from engine.sim.simulator import EngineShape, Simulator

    if args.workload == "poisson":
        specs = wl.poisson(args.rate, args.n, wl.Lengths.parse(args.prompt),
                           wl.Lengths.parse(args.output), tier_shares(args.tiers), args.seed,
                           constrained=args.constrained)
    elif args.workload == "at-once":
        mix = [int(x) for x in args.output.split(",")]
        specs = wl.at_once(args.n, mix, wl.Lengths.parse(args.prompt).low)
    else:
        if not args.trace:
            raise ValueError("trace: give the JSONL file")
        specs = wl.load_trace(args.trace)
    sim = Simulator(cost_model(args.step_ms, args.profile),
                    SchedulerConfig(max_num_seqs=args.max_num_seqs,
                                    max_num_batched_tokens=args.max_num_batched_tokens,
                                    batching=args.batching, max_wait_ms=args.max_wait_ms),
                    CacheConfig(block_size=args.block_size), EngineShape(args.num_blocks))
    result = sim.run(specs)
    text = f"{run_overview(result)}\n\n{tier_table(result.tier_summaries())}"
    if args.plot:
        from engine.sim.plots import write_plots

        written = write_plots(result, args.plot)
        text += "\n\n" + ("plots: " + ", ".join(map(str, written)) if written
                          else "plots: matplotlib is not installed; none written")
    return text


def seed000_report() -> str:
    from engine.sim import seed000

    five, mix = seed000.five_requests(), seed000.mix()
    return "\n\n".join([
        (f"Seed 000, simulated: the engine's Scheduler on a virtual clock, {seed000.SLOTS} slots, "
        f"{seed000.STEP_S * 1e3:.0f} ms a step, prefill counted as zero"),
        _five_table(five), _mix_table(mix)])


def _five_table(five: seed000.FiveRequests) -> str:
    from engine.sim import seed000
    from engine.sim.report import seconds, table

    st, co = five.static.by_id(), five.continuous.by_id()
    head = ("Five requests: " + " ".join(f"{k}{n}" for k, n in seed000.FIVE.items())
            + " (E queued right behind the first four)")
    totals = table(["", "static", "continuous"], [
        ["total time", seconds(five.static.makespan, 1), seconds(five.continuous.makespan, 1)],
        ["tokens", str(five.static.output_tokens), str(five.continuous.output_tokens)]])
    rows = []
    for rid, n in seed000.FIVE.items():
        a, b = st[rid].latency, co[rid].latency
        note = f"({a / b:.1f}x faster)" if a / b > 1.05 else ""
        rows.append([f"{rid} ({n} tokens)", seconds(a, 1), seconds(b, 1), note])
    mean = lambda r: sum(x.latency for x in r.requests) / len(r.requests)
    rows.append(["mean", seconds(mean(five.static), 1), seconds(mean(five.continuous), 1), ""])
    return "\n\n".join([head, totals, table(["request latency", "static", "continuous", ""], rows)])


def _mix_table(mix: seed000.Mix) -> str:
    from engine.sim import seed000
    from engine.sim.report import seconds, table

    short, long_ = seed000.MIX
    sat_s = seed000.saturated_seconds(mix.saturated)
    n = seed000.MIX_N
    rows = [
        ["static (each batch runs to its longest)", seconds(mix.static.makespan, 1),
         f"{mix.tokens / mix.static.makespan:.0f} tok/s", "1.0x"],
        ["continuous, queue kept full (the seed)", seconds(sat_s, 1),
         f"{mix.tokens / sat_s:.0f} tok/s", f"{mix.static.makespan / sat_s:.1f}x"],
        [f"continuous, these {n} requests only", seconds(mix.continuous.makespan, 1),
         f"{mix.tokens / mix.continuous.makespan:.0f} tok/s",
         f"{mix.static.makespan / mix.continuous.makespan:.1f}x"],
    ]
    slots = seed000.SLOTS
    thin = [s for s in mix.continuous.steps if s.rows < slots]
    empty = sum(slots - s.rows for s in thin)
    why = (f"Why two continuous figures: the seed assumes the queue never runs dry, so every "
           f"step fills all {slots} seats: {mix.tokens:,} / {slots} = {mix.tokens // slots:,} "
           f"steps = {sat_s:.1f} s. With only these {n} requests the queue empties while the "
           f"last long requests still run: {len(thin)} steps ran with empty seats "
           f"({empty} seat-steps, {empty * seed000.STEP_S / slots:.1f} s of {slots}-seat time), "
           f"hence {mix.continuous.makespan:.1f} s.")
    return "\n\n".join([
        (f"{n} requests: {n // 2} x {short} + {n // 2} x {long_} tokens, alternating = "
        f"{mix.tokens:,} tokens"),
        table(["", "time", "throughput", "speed-up"], rows), textwrap.fill(why, 96)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carpool simulate", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
