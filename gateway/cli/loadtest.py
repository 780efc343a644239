"""`carpool loadtest` and `carpool plan --verify`: the gateway's one door to ``loadtests/``.

``loadtests/`` stands above the gateway (it starts a deployment and drives it over HTTP), so
the gateway imports nothing of it at module level. This module holds the command's flags
(argparse only) and the two calls into it, each a lazy import inside a function:
``run`` (``loadtests.cli``: Locust headless, a per-tier report) and ``verify``
(``loadtests.plan_verify``: serve a plan's flags, load-test, replay through the simulator).
tests/test_import_graph.py allows these imports here and nowhere else in ``gateway/``
(docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.sim.cost import CostModel
    from engine.sim.planner import Plan


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


def run(args: argparse.Namespace) -> int:
    from loadtests.cli import run as run_loadtest

    return run_loadtest(args)


def verify(plan: Plan, cost: CostModel, run_time: str, out_dir: str) -> str:
    from loadtests.plan_verify import verify as verify_plan

    return verify_plan(plan, cost, run_time, out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carpool loadtest",
                                     description="Locust load test with a per-tier report")
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
