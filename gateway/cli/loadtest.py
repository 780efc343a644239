"""`carpool loadtest`: start a local deployment (or target ``--host``), run the Locust file
headless for a bounded time, write a per-tier report (report.md, report.json, ttft.png,
tpot.png, Locust's CSV/HTML) to ``--out``, and stop everything it started."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("loadtest", help="Locust load test with a per-tier TTFT/TPOT report")
    configure(p)
    p.set_defaults(func=run)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="loadtest-report", help="report folder")
    p.add_argument("--users", type=int, default=6, help="concurrent users, split over tiers")
    p.add_argument("--spawn-rate", type=float, default=0.0, help="users/s (0 = all at once)")
    p.add_argument("--run-time", default="60s", help="Locust format: 30s, 2m, 1h")
    p.add_argument("--mix", default="chat=0.8,summary=0.2", help="request profile shares")
    p.add_argument("--chat", default="24:32", help="short chat: prompt words:max_tokens")
    p.add_argument("--summary", default="400:128", help="long summary: words:max_tokens")
    p.add_argument("--host", default=None,
                   help="drive this deployment instead of starting one (keys: --keys-file or "
                        "LOCUST_CARPOOL_KEYS=tier=key,...)")
    p.add_argument("--keys-file", default=None, help="lines of tier=key for --host")
    g = p.add_argument_group("local deployment (without --host)")
    g.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    g.add_argument("--engine", choices=("real", "echo"), default="real")
    g.add_argument("--max-num-seqs", type=int, default=None)
    g.add_argument("--num-blocks", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--rpm", default="", help="per-tier requests/minute limits, e.g. "
                   "best-effort=30 (to see intended 429s); default unlimited")


def _pairs(raw: str) -> dict[str, str]:
    out = {}
    for part in raw.replace("\n", ",").split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
    from loadtests.report import to_markdown
    from loadtests.runner import LoadTestOptions, run_loadtest

    opts = LoadTestOptions(
        out_dir=Path(args.out), users=args.users, spawn_rate=args.spawn_rate,
        run_time=args.run_time, mix=args.mix, chat=args.chat, summary=args.summary,
    )
    if args.host:
        keys = _pairs(Path(args.keys_file).read_text()) if args.keys_file else None
        rows = run_loadtest(opts, host=args.host, keys=keys)
    else:
        rows = run_loadtest(opts, serve=lambda: _serve(args),
                            meta={"model": args.model or "SmolLM2-135M-Instruct",
                                  "engine": args.engine})
    sys.stdout.write(to_markdown(rows, {"report": str(opts.out_dir)}) + "\n")
    return 0 if all(r.errors == 0 for r in rows) else 1


def _serve(args: argparse.Namespace) -> Any:
    from gateway.config import GatewayConfig
    from loadtests.local_server import local_server

    engine_options = {k: getattr(args, k) for k in ("max_num_seqs", "num_blocks", "max_model_len")
                      if getattr(args, k) is not None}
    config = GatewayConfig.from_env(model=args.model, engine=args.engine,
                                    engine_options=engine_options or None,
                                    namespace="loadtest")
    rpm = {tier: int(v) for tier, v in _pairs(args.rpm).items()}
    return local_server(config, rpm)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carpool loadtest", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
