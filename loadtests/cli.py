"""`carpool loadtest`'s run: start a local deployment (or target ``--host``), run the Locust
file headless for a bounded time, write a per-tier report (report.md, report.json, ttft.png,
tpot.png, Locust's CSV/HTML) to ``--out``, and stop everything it started.

The command's flags and ``main`` are ``gateway.cli.loadtest``'s (the CLI lists them without
importing this package); it calls ``run`` here through its one lazy import.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from loadtests.local_server import local_server
from loadtests.report import to_markdown
from loadtests.runner import LoadTestOptions, run_loadtest


def _pairs(raw: str) -> dict[str, str]:
    out = {}
    for part in raw.replace("\n", ",").split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
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
    engine_options = {k: getattr(args, k) for k in ("max_num_seqs", "num_blocks", "max_model_len")
                      if getattr(args, k) is not None}
    config = GatewayConfig.from_env(model=args.model, engine=args.engine,
                                    engine_options=engine_options or None,
                                    namespace="loadtest")
    rpm = {tier: int(v) for tier, v in _pairs(args.rpm).items()}
    return local_server(config, rpm)
