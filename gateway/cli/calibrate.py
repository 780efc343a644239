"""`carpool calibrate`: time the real engine on a grid of batch shapes and on a short served
run (requests arriving into a full batch: mixed prefill and decode steps on unequal contexts),
and write the step-cost profile the simulator and planner use (``engine.bench.calibrate``,
``engine.sim.profile``).

    carpool calibrate [--model DIR] [--device cpu|cuda] [--out FILE] [--rows 1,4,16,32]
                      [--prompts 16,256] [--decode-steps 6] [--mixed-requests 32]
                      [--max-num-seqs 32]

Prints the fitted coefficients and the fit's relative error on its own samples. Timings on a
shared machine are noisy: calibrate when the machine is as loaded as it will be in service.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="measure the engine's step cost for the simulator")
    configure(p)
    p.set_defaults(func=run)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-dtype", choices=("auto", "float16"), default="auto",
                   help="as serve's: float16 profiles an fp16 KV cache (2 bytes an element)")
    p.add_argument("--out", default=None, help="profile path (default ~/.cache/carpool/profiles/)")
    p.add_argument("--rows", default="1,4,16,32", help="batch rows of the grid")
    p.add_argument("--prompts", default="16,256", help="prompt lengths of the grid")
    p.add_argument("--decode-steps", type=int, default=6)
    p.add_argument("--max-prefill-tokens", type=int, default=2048,
                   help="skip grid points whose prefill is larger (keeps the run short)")
    p.add_argument("--mixed-requests", type=int, default=32,
                   help="requests in the served run (0: the grid only)")
    p.add_argument("--constrained-share", type=float, default=0.25,
                   help="share of the served run's requests under a JSON Schema (the mask cost)")
    p.add_argument("--max-num-seqs", type=int, default=32,
                   help="batch seats (the served run fills them; the grid's largest rows)")


def _ints(raw: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what}: expected a comma list of integers, got {raw!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--{what}: integers >= 1, got {raw!r}")
    return values


def run(args: argparse.Namespace) -> int:
    from engine.bench.calibrate import calibrate
    from engine.llm_engine import LLMEngine
    from engine.sim.profile import default_profile_path

    try:
        rows, prompts = _ints(args.rows, "rows"), _ints(args.prompts, "prompts")
        if args.decode_steps < 1:
            raise ValueError("--decode-steps must be >= 1")
        if args.mixed_requests < 0 or args.max_num_seqs < 1:
            raise ValueError("--mixed-requests must be >= 0 and --max-num-seqs >= 1")
        if not 0.0 <= args.constrained_share <= 1.0:
            raise ValueError("--constrained-share must be in [0, 1]")
        engine = LLMEngine.from_kwargs(model=args.model, device=args.device, dtype=args.dtype,
                                       max_num_seqs=args.max_num_seqs,
                                       kv_cache_dtype=args.kv_cache_dtype)
    except ValueError as e:
        sys.stderr.write(f"carpool calibrate: {e}\n")
        return 2
    profile = calibrate(engine, mixed_requests=args.mixed_requests,
                        constrained_share=args.constrained_share, rows_grid=rows,
                        prompt_grid=prompts, decode_steps=args.decode_steps,
                        max_prefill_tokens=args.max_prefill_tokens)
    out = args.out or default_profile_path(engine.model_name, profile.device)
    profile.save(out)
    c = profile.cost
    med, p90 = profile.fit_error()
    sys.stdout.write(
        f"{len(profile.samples)} steps of {profile.model} on {profile.device} ({profile.cpu})\n"
        f"step seconds = {c.base:.5f} + {c.per_row:.3e}*rows + {c.per_token:.3e}*tokens + "
        f"{c.per_kv_token:.3e}*kv_tokens + {c.per_prefill_row:.3e}*prefill_rows + "
        f"{c.per_constrained_row:.3e}*constrained_rows\n"
        f"fit relative error on its samples: median {med:.1%}, p90 {p90:.1%}\n"
        f"wrote {out}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carpool calibrate", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
