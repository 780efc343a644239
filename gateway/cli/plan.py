"""`carpool plan`: how many instances, with which knobs, meet per-tier TTFT/TPOT p99 targets at
a peak load; seed 004 section 12's order, printed step by step (``engine.sim.planner``).

    carpool plan --tier interactive=ttft:2,tpot:0.25,share:0.7 \
                 --tier batch=ttft:60,tpot:1,share:0.3 \
                 --peak-rps 3 --prompt 16:128 --output 16:64 --kv-memory-gb 0.25 [--verify]

The step cost is a calibrated profile (``carpool calibrate``; ``--profile``) or ``--step-ms``.
The model's KV shape comes from the profile (or ``--layers/--kv-heads/--head-dim/
--dtype-bytes``; default SmolLM2-135M in fp32). ``--verify`` serves one instance with the
recommended flags and load-tests it (``loadtests.plan_verify``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.sim.planner import PlanInputs


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="capacity plan: instances and serve flags for TTFT/TPOT targets")
    configure(p)
    p.set_defaults(func=run)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", action="append", default=[], required=True,
                   help="<tier>=ttft:S,tpot:S[,share:X] (repeat per tier)")
    p.add_argument("--peak-rps", type=float, required=True, help="peak requests/s, all tiers")
    p.add_argument("--prompt", default="64:256", help="prompt tokens: N or LOW:HIGH (uniform)")
    p.add_argument("--output", default="32:128", help="output tokens: N or LOW:HIGH (uniform)")
    p.add_argument("--kv-memory-gb", type=float, default=1.0, help="KV cache memory per instance")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--profile", default=None, help="calibrated profile (default: carpool calibrate's)")
    p.add_argument("--step-ms", type=float, default=None, help="fixed step cost instead of a profile")
    for name in ("layers", "kv-heads", "head-dim", "dtype-bytes"):
        p.add_argument(f"--{name}", type=int, default=None, help="model KV shape override")
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--constrained", type=float, default=0.0,
                   help="share of requests with structured outputs or tools (0..1)")
    p.add_argument("--shared-prefixes", type=int, default=0,
                   help="simulate multi-turn chats over this many shared system prompts on the "
                        "plan's instances, with and without prefix-aware placement (0 = off)")
    p.add_argument("--prefix-tokens", type=int, default=500,
                   help="tokens of each shared system prompt (--shared-prefixes)")
    p.add_argument("--skewed", action="store_true",
                   help="--shared-prefixes: half the chats share one system prompt")
    p.add_argument("--verify", action="store_true", help="serve one instance and load-test it")
    p.add_argument("--verify-run-time", default="45s")
    p.add_argument("--verify-out", default="plan-verify")


def parse_tier(raw: str) -> Any:
    from engine.sim.planner import PlanError, TierTarget

    tier, sep, body = raw.partition("=")
    fields: dict[str, float] = {}
    for part in (x.strip() for x in body.split(",") if x.strip()):
        key, colon, value = part.partition(":")
        if key not in ("ttft", "tpot", "share") or not colon:
            raise PlanError(f"--tier {raw!r}: unknown part {part!r} (ttft:S, tpot:S, share:X)")
        try:
            fields[key] = float(value)
        except ValueError:
            raise PlanError(f"--tier {raw!r}: {key} must be a number, got {value!r}") from None
    if not sep or "ttft" not in fields or "tpot" not in fields:
        raise PlanError(f"--tier {raw!r}: expected <tier>=ttft:S,tpot:S[,share:X]")
    return TierTarget(tier.strip(), fields["ttft"], fields["tpot"], fields.get("share", 1.0))


def build(args: argparse.Namespace) -> tuple[PlanInputs, Any, str]:
    """The planner's inputs, cost model and a line describing the cost model."""
    from engine.sim.cost import FixedCost
    from engine.sim.planner import PlanInputs
    from engine.sim.profile import SMOLLM2_135M_FP32, Profile, default_profile_path
    from engine.sim.workload import Lengths

    shape = SMOLLM2_135M_FP32
    if args.step_ms is not None:
        cost: Any = FixedCost(args.step_ms / 1e3)
        about = f"fixed: every step {args.step_ms:g} ms"
    else:
        path = args.profile or default_profile_path()
        profile = Profile.load(path)
        cost, shape = profile.cost_model(), profile.shape
        c = profile.cost
        about = (f"calibrated ({path}: {profile.model} on {profile.device}, {profile.cpu}): step s = "
                 f"{c.base:.4f} + {c.per_row:.2e} rows + {c.per_token:.2e} tokens + "
                 f"{c.per_kv_token:.2e} kv_tokens + {c.per_prefill_row:.2e} prefill rows + "
                 f"{c.per_constrained_row:.2e} constrained rows")
    overrides = {k: getattr(args, k) for k in ("layers", "kv_heads", "head_dim", "dtype_bytes")
                 if getattr(args, k) is not None}
    if overrides:
        shape = dataclasses.replace(shape, **overrides)
    inputs = PlanInputs(tuple(parse_tier(t) for t in args.tier), args.peak_rps,
                        Lengths.parse(args.prompt), Lengths.parse(args.output), args.kv_memory_gb,
                        shape, args.block_size, args.max_batch, seed=args.seed,
                        constrained=args.constrained)
    return inputs, cost, about


def run(args: argparse.Namespace) -> int:
    from engine.sim.planner import make_plan
    from gateway.cli.plan_report import render

    try:
        inputs, cost, about = build(args)
        plan = make_plan(inputs, cost)
    except ValueError as e:  # PlanError included: impossible targets, bad inputs
        sys.stderr.write(f"carpool plan: {e}\n")
        return 2
    sys.stdout.write(render(plan, about) + "\n")
    if not plan.feasible:
        return 1
    if args.shared_prefixes > 0:
        from engine.sim.fleet import plan_placement
        from gateway.cli.plan_report import placement_section

        got = plan_placement(plan, cost, args.shared_prefixes, args.prefix_tokens, args.skewed)
        sys.stdout.write("\n" + placement_section(got, args.shared_prefixes,
                                                   args.prefix_tokens, args.skewed) + "\n")
    if args.verify:
        from gateway.cli.loadtest import verify

        sys.stdout.write(verify(plan, cost, args.verify_run_time, args.verify_out) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carpool plan", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
