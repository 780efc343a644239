"""The ``carpool`` command. Each subcommand lives in its own small function or module and
imports what it needs lazily, so ``carpool tenants ...`` never imports torch.

    carpool serve     [--role all|gateway|worker] [--engine real|echo] [--model DIR] ...
    carpool tenants   list | create | set-quota | issue-key | keys | revoke-key
    carpool generate  "prompt" [--max-tokens N] [--model DIR]      (gateway/cli/generate.py)
    carpool bench     engine | kernels | gateway | sla | serve | gpu [ARGS...]
    carpool doctor    [--url URL] [--admin-key KEY]   batching symptoms now (gateway/cli/doctor.py)
    carpool simulate  seed000 | poisson | at-once | trace FILE     (gateway/cli/simulate.py)
    carpool plan      --tier ... --peak-rps R [--verify]           (gateway/cli/plan.py)
    carpool calibrate [--out PROFILE]                              (gateway/cli/calibrate.py)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API (gateway + worker + engine)")
    p.add_argument("--host", default=None, help="default 127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default 8000")
    p.add_argument("--role", choices=("all", "gateway", "worker"), default=None)
    p.add_argument("--engine", choices=("real", "echo"), default=None,
                   help="echo = a FAKE instant engine that echoes the prompt (benchmarks)")
    p.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    p.add_argument("--tenants", dest="tenants_file", default=None, help="tenants TOML/YAML file")
    p.add_argument("--namespace", default=None, help="Redis key prefix (default carpool)")
    p.add_argument("--redis-ca", default=None,
                   help="CA file that signed the Redis server's certificate (rediss://)")
    p.add_argument("--redis-cert", default=None, help="client certificate for Redis TLS")
    p.add_argument("--redis-key", default=None, help="the client certificate's key file")
    p.add_argument("--no-demo", dest="create_demo_tenant", action="store_const", const=False,
                   default=None, help="do not create the demo tenant on a fresh Redis")
    p.add_argument("--echo-step-ms", type=float, default=None)
    p.add_argument("--trace-console", action="store_const", const=True, default=None,
                   help="print finished spans to stdout (OTLP: set OTEL_EXPORTER_OTLP_ENDPOINT)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="--role worker: serve /metrics on this port")
    p.add_argument("--drain-timeout", dest="drain_timeout_s", type=float, default=None,
                   help="seconds a stopping process lets its requests finish (default 30; "
                        "a worker then hands the rest to another worker)")
    p.add_argument("--placement-wait-ms", dest="placement_wait_ms", type=float, default=None,
                   help="prefix-aware placement: a worker other than the one a prompt's prefix "
                        "hashes to takes it only after this wait (default 0 = off)")
    p.add_argument("--placement-blocks", dest="placement_blocks", type=int, default=None,
                   help="leading KV blocks of a prompt that choose its worker (default 16)")
    p.add_argument("--placement-load-factor", dest="placement_load_factor", type=float,
                   default=None, help="a worker past this x the mean of recent placements is "
                                      "passed over (default 1.25; 0 = no bound)")
    p.add_argument("--access-log", action="store_const", const=True, default=None,
                   help="log a line per HTTP request (off by default)")
    p.add_argument("--strict-api", action="store_const", const=True, default=None,
                   help="refuse unknown request fields with a 400 (default: ignore them)")
    p.add_argument("--tier-slos", default=None,
                   help="per-tier objectives, e.g. 'interactive=ttft:2,tpot:0.5,shed;"
                        "batch=ttft:120,queue' (over CARPOOL_TIER_SLOS and the tenants file)")
    g = p.add_argument_group("engine options (passed to EngineConfig.from_kwargs)")
    g.add_argument("--dtype", default=None)
    g.add_argument("--max-num-seqs", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--num-blocks", type=int, default=None)
    g.add_argument("--block-size", type=int, default=None)
    g.add_argument("--kv-cache-memory-gb", type=float, default=None)
    g.add_argument("--preemption-mode", choices=("recompute", "swap"), default=None)
    g.add_argument("--device", default=None)
    g.add_argument("--kv-cache-dtype", choices=("auto", "float16"), default=None,
                   help="float16: half the KV bytes a token (more context, faster attention at "
                        "large batches; lossy, opt-in; default auto = the model's dtype)")
    g.add_argument("--quantization", choices=("int8",), default=None,
                   help="int8 weights in the decoder's linears and the LM head (CPU, fp32 "
                        "activations; lossy, opt-in)")
    p.set_defaults(func=_run_serve)


ENGINE_FLAGS = ("dtype", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "num_blocks", "block_size", "kv_cache_memory_gb", "preemption_mode", "device",
                "quantization", "kv_cache_dtype")
CONFIG_FLAGS = ("host", "port", "role", "engine", "model", "tenants_file", "namespace",
                "create_demo_tenant", "echo_step_ms", "trace_console", "metrics_port",
                "access_log", "tier_slos", "strict_api", "drain_timeout_s", "placement_wait_ms",
                "placement_blocks", "placement_load_factor", "redis_ca", "redis_cert",
                "redis_key")


def _run_serve(args: argparse.Namespace) -> int:
    from gateway.cli.serve import serve
    from gateway.config import GatewayConfig

    engine_options = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k) is not None}
    config = GatewayConfig.from_env(**{k: getattr(args, k) for k in CONFIG_FLAGS},
                                    engine_options=engine_options or None)
    return serve(config)


def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench",
                       help="benchmarks: engine, kernels, gateway, sla, serve, gpu, rolling, "
                            "placement, redis")
    p.add_argument("target", choices=("engine", "kernels", "gateway", "sla", "serve", "gpu",
                                      "rolling", "placement", "redis"))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for that benchmark")
    p.set_defaults(func=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module({"engine": "engine.bench.engine",
                                      "kernels": "kernels.bench.gpu_kernels",
                                      "gateway": "gateway.bench.gateway",
                                      "sla": "gateway.bench.sla",
                                      "serve": "gateway.bench.serve",
                                      "gpu": "engine.bench.gpu",
                                      "rolling": "gateway.bench.rolling",
                                      "placement": "gateway.bench.placement",
                                      "redis": "gateway.bench.redis"}[args.target])
    return int(module.main(list(args.rest)) or 0)


def build_parser() -> argparse.ArgumentParser:
    from gateway.cli import calibrate as cli_calibrate
    from gateway.cli import doctor as cli_doctor
    from gateway.cli import generate as cli_generate
    from gateway.cli import loadtest as cli_loadtest
    from gateway.cli import plan as cli_plan
    from gateway.cli import simulate as cli_simulate
    from gateway.cli import tenants as cli_tenants

    parser = argparse.ArgumentParser(prog="carpool", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    cli_tenants.add_parser(sub)
    cli_generate.add_parser(sub)
    cli_loadtest.add_parser(sub)
    cli_simulate.add_parser(sub)
    cli_plan.add_parser(sub)
    cli_calibrate.add_parser(sub)
    cli_doctor.add_parser(sub)
    _add_bench(sub)
    return parser


# Commands whose engine shares the cores with an event loop and Redis. OpenMP's default
# busy-wait between parallel regions starves those threads (measured: a 4-request decode step
# went from 67 to 975 ms with one competing busy core; 109 ms with PASSIVE). Measured again
# with oneDNN linears (`python -m engine.bench.omp_wait`, 2-core AMD EPYC VM shared with other
# work, decode step ms median of 3 runs, batch 1 / 8 / 32, quiet | one busy Python process):
# PASSIVE 42-47 / 46-60 / 83-102 | 50-54 / 60 / 126; GOMP_SPINCOUNT=500 41 / 51 / 97 | 56 / 65
# / 140; 1000 42 / 42 / 87 | 61 / 69 / 150; 2000 41-46 / 51-53 / 76-98 | 72 / 78-81 / 152-170;
# 20000 39 / 41 / 74 | 152 / 147 / 302; default spin 40 / 34 / 68 | 95 / 168 / 276; 1 thread
# 49 / 53-59 / 114-124 | 48-57 / 56-58 / 124-129. PASSIVE costs a futex wake of the second thread
# per parallel region (121 a step at 1 row, all oneDNN linears; ~50-95 us each on this VM for the
# small ones: ~8 ms of linears at 1 row), and served 1-stream ITL p50 was 46-57 ms vs 35-44 with
# GOMP_SPINCOUNT=20000; but every spin count lost beside the busy process (500: 4-11%, 20000:
# 140-200%), the short ones gained nothing clear quiet, and one thread is slower quiet: no
# setting has both on this machine, and PASSIVE stays. GOMP_SPINCOUNT=20000 with one torch thread
# while a neighbour runs had both (1 row 32 | 47 ms, 32 rows 68 | 118 vs PASSIVE's 42 | 52, 93 |
# 124): a per-step thread count chosen by contention, not built yet (docs/benchmarks.md,
# OpenMP wait policies). Must be set before torch loads libgomp, i.e. before any subcommand imports the
# engine. Written at run time in main(), for those commands only, not when this module is
# imported (tests import it), and the one environment write in the gateway: gateway/config.py
# only reads.
_SHARED_CORE_COMMANDS = ("serve", "loadtest", "calibrate", "plan")
# Opt-in (CARPOOL_ADAPTIVE_THREADS=1, read by GatewayConfig): the spin that is faster quiet, with
# the step thread dropping to fewer torch threads while other tasks hold cores
# (policies/step_threads.py); it was not measured against PASSIVE served, so not the default.
# An OMP_WAIT_POLICY or GOMP_SPINCOUNT already in the environment wins either way.
ADAPTIVE_SPINCOUNT = "20000"


def _set_openmp_wait() -> None:
    from gateway.config import GatewayConfig

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if not os.environ.get(name, "x").strip():
            # set but empty is no choice: libgomp warns, ignores it and spins, the one setting
            # that collapses when a neighbour is busy
            del os.environ[name]
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    if GatewayConfig.from_env().adaptive_threads:
        os.environ["GOMP_SPINCOUNT"] = ADAPTIVE_SPINCOUNT
    else:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def main(argv: Sequence[str] | None = None) -> int:
    try:  # engine/__init__ refuses a foreign `kernels` package: one line, not a traceback
        import engine  # noqa: F401
    except ImportError as exc:
        if exc.name != "kernels":
            raise
        print(exc, file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    # bench serve: its offline row runs under the policy of the server it is compared with
    serve_bench = args.command == "bench" and args.target == "serve"
    if args.command in _SHARED_CORE_COMMANDS or serve_bench:
        _set_openmp_wait()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
