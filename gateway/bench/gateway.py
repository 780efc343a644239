"""``carpool bench gateway``: what the gateway adds on top of an instant engine.

The engine is the FAKE echo engine (no model), so every millisecond measured is gateway:
HTTP, auth, tokenization, the Lua admission, the Redis queue, the worker, the per-step
output write and the relay back. One run, one table, ratios against baselines
measured in the same run on the same machine:
  direct     ``FakeEchoEngine.generate`` called in-process (no HTTP, no Redis)
  http-floor ``GET /healthz`` through the same uvicorn process (the HTTP client+server cost)
The "ledger on/off" rows measure what the usage ledger adds: one request at a time (a
1-token non-streaming completion, so the engine's step jitter hides little), alternating in
rounds between the served process (ledger on, the default) and a second one started with
``CARPOOL_LEDGER=0``, on the same Redis.
The gateway runs as its own process (``carpool serve --engine echo``, gateway + worker +
engine in one process); the "split roles" rows run ``--role gateway`` and ``--role worker`` as
two processes (the engine's loop then no longer shares the gateway's). The load generator is
this process, so on a small machine both share the CPUs. By default it is the lean asyncio
HTTP/1.1 keep-alive client of ``client.py`` (``--client httpx`` for the heavier httpx);
whatever it costs is still counted as gateway latency. The direct baseline and the load
generator run on the same event loop implementation as the gateway's uvicorn (uvloop when
installed). The FAKE engine steps on a thread of its own at a fixed cadence, as the real
engine does, on both sides: the gateway's work on the event loop cannot stretch its steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.bench.load import (
    PROMPT,
    closed_loop,
    httpx_calls,
    lean_calls,
    open_loop,
    pin,
    server_pids,
)
from gateway.process import child_env, free_port, loop_factory, run_loop, stop_children

SECRET = "bench-secret"


@dataclass
class Row:
    name: str
    latencies_s: list[float]
    wall_s: float
    tokens: int = 0

    def pct(self, q: float) -> float:
        data = sorted(self.latencies_s)
        return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")

    @property
    def rps(self) -> float:
        return len(self.latencies_s) / self.wall_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


async def direct_rows(tokenizer: Any, args: argparse.Namespace) -> list[Row]:
    from engine.core.sampling_params import SamplingParams
    from engine.frontend.echo import FakeEchoEngine

    engine = FakeEchoEngine(tokenizer, step_ms=args.step_ms)
    await engine.start()
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    counter = iter(range(10 ** 9))

    def call(max_tokens: int) -> Any:
        async def one() -> int:
            n = 0
            async for out in engine.generate(f"d{next(counter)}", prompt,
                                             SamplingParams(max_tokens=max_tokens)):
                n += len(out.new_token_ids)
            return n
        return one

    rows = []
    lat, wall, tok = await closed_loop(args.requests, args.concurrency, call(args.max_tokens))
    rows.append(Row("direct (in-process engine.generate)", lat, wall, tok))
    lat, wall, tok = await closed_loop(args.concurrency * 2, args.concurrency,
                                        call(args.stream_tokens))
    rows.append(Row("direct streamed tokens", lat, wall, tok))
    lat, wall = await open_loop(args.rate, args.duration, call(args.max_tokens))
    rows.append(Row(f"direct @ {args.rate:g} req/s", lat, wall))
    await engine.shutdown()
    return rows


async def gateway_rows(url: str, key: str, args: argparse.Namespace,
                       pinned: tuple[list[int], list[int]] | None = None) -> list[Row]:
    make = lean_calls if args.client == "lean" else httpx_calls
    async with make(url, key, args) as calls:
        completion = calls.completion
        await closed_loop(64, 8, completion(args.max_tokens, False))  # warm-up
        rows = []
        for name, fn in (("http-floor (GET /healthz)", calls.floor),
                         ("gateway non-streaming", completion(args.max_tokens, False)),
                         ("gateway streaming", completion(args.max_tokens, True))):
            lat, wall, tok = await closed_loop(args.requests, args.concurrency, fn)
            rows.append(Row(name, lat, wall, tok))
        lat, wall, tok = await closed_loop(args.concurrency * 2, args.concurrency,
                                            completion(args.stream_tokens, True))
        rows.append(Row("gateway streamed tokens", lat, wall, tok))
        lat, wall = await open_loop(args.rate, args.duration, completion(args.max_tokens, False))
        rows.append(Row(f"gateway @ {args.rate:g} req/s", lat, wall))
        if pinned is not None:  # the same, the client on one core and the server on the other
            with pin(*pinned):
                lat, wall = await open_loop(args.rate, args.duration,
                                             completion(args.max_tokens, False))
            rows.append(Row(f"gateway @ {args.rate:g} req/s, client pinned apart", lat, wall))
    return rows


async def split_rows(url: str, key: str, args: argparse.Namespace) -> list[Row]:
    """The gateway in its own process (``--role gateway``), the worker and the FAKE engine in
    another (``--role worker``): what one gateway process streams when it does not also run
    the engine's loop."""
    make = lean_calls if args.client == "lean" else httpx_calls
    async with make(url, key, args) as calls:
        await closed_loop(64, 8, calls.completion(args.max_tokens, False))  # warm-up
        lat, wall, tok = await closed_loop(args.concurrency * 2, args.concurrency,
                                           calls.completion(args.stream_tokens, True))
        rows = [Row("gateway streamed tokens, split roles", lat, wall, tok)]
        lat, wall = await open_loop(args.rate, args.duration,
                                    calls.completion(args.max_tokens, False))
        rows.append(Row(f"gateway @ {args.rate:g} req/s, split roles", lat, wall))
    return rows


LEDGER_ROUNDS = 4


async def ledger_rows(url_on: str, url_off: str, key: str, args: argparse.Namespace
                      ) -> list[Row]:
    """1-token non-streaming requests, one at a time, with the ledger on and off, in
    alternating rounds (so a drift of the machine's load hits both alike)."""
    make = lean_calls if args.client == "lean" else httpx_calls
    lat: dict[str, list[float]] = {"on": [], "off": []}
    wall = {"on": 0.0, "off": 0.0}
    async with make(url_on, key, args) as on, make(url_off, key, args) as off:
        for calls in (on, off):
            await closed_loop(64, 8, calls.completion(1, False))  # warm-up
        for _ in range(LEDGER_ROUNDS):
            for name, calls in (("on", on), ("off", off)):
                got, w, _ = await closed_loop(max(1, args.requests // LEDGER_ROUNDS), 1,
                                              calls.completion(1, False))
                lat[name] += got
                wall[name] += w
    return [Row("gateway 1 token, one at a time, ledger on", lat["on"], wall["on"]),
            Row("gateway 1 token, one at a time, ledger off", lat["off"], wall["off"])]


def start_server(redis_url: str, port: int, args: argparse.Namespace,
                 role: str, **env_extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gateway.cli.main", "serve", "--role", role, "--engine", "echo",
           "--port", str(port), "--no-demo", "--namespace", "bench",
           "--echo-step-ms", str(args.step_ms)]
    if args.model:
        cmd += ["--model", args.model]
    cmd += getattr(args, "extra", [])  # more ``carpool serve`` flags
    env = child_env(REDIS_URL=redis_url, CARPOOL_SECRET=SECRET, **env_extra)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def serving(redis_url: str, port: int, args: argparse.Namespace,
            roles: tuple[str, ...], **env_extra: str
            ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``carpool serve`` processes of ``roles`` (the first one serves HTTP on ``port``)."""
    procs = [start_server(redis_url, port, args, role, **env_extra) for role in roles]
    try:
        wait_ready(f"http://127.0.0.1:{port}", procs[0])
        yield procs
    finally:
        stop_children(procs, 15)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("gateway process exited")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("gateway not ready")


async def make_key(redis_url: str) -> str:
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.tenants import Tenant, TenantStore

    client = redis_client(redis_url)
    try:
        store = TenantStore(client, RedisKeys("bench"), SECRET.encode())
        await store.put(Tenant("bench"))
        key, _ = await store.issue_key("bench")
        return key
    finally:
        await client.aclose()


def table(direct: list[Row], gw: list[Row], args: argparse.Namespace) -> str:
    base = {"nonstream": direct[0], "tokens": direct[1], "rate": direct[2]}
    lines = [("| path | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | tokens/s | "
             "req/s vs direct |"), "|---|---|---|---|---|---|---|---|"]
    for row in direct + gw:
        if "one at a time" in row.name:  # its own baseline: the ledger-off row
            lines.append(f"| {row.name} | {row.pct(0.5):.2f} | {row.pct(0.99):.2f} | - | - | "
                         f"{row.rps:.0f} | - | - |")
            continue
        ref = base["rate"] if "@" in row.name else (
            base["tokens"] if "tokens" in row.name else base["nonstream"])
        added = row is not ref and "direct" not in row.name
        lines.append(
            f"| {row.name} | {row.pct(0.5):.2f} | {row.pct(0.99):.2f} | "
            f"{row.pct(0.5) - ref.pct(0.5):.2f} | {row.pct(0.99) - ref.pct(0.99):.2f} | "
            if added else f"| {row.name} | {row.pct(0.5):.2f} | {row.pct(0.99):.2f} | - | - | ")
        lines[-1] += (f"{row.rps:.0f} | {row.tokens_per_s:.0f} | "
                      f"{row.rps / ref.rps:.3f} |" if "@" not in row.name else
                      f"{row.rps:.0f} (offered {args.rate:g}) | - | - |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="carpool bench gateway", description=__doc__)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--stream-tokens", type=int, default=512)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--step-ms", type=float, default=1.0,
                   help="fake engine step time, the same for the direct baseline")
    p.add_argument("--client", choices=("lean", "httpx"), default="lean",
                   help="load generator: lean asyncio HTTP/1.1 (default) or httpx")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="skip the extra row with the client pinned to CPU 0")
    p.add_argument("--no-split", dest="split", action="store_false",
                   help="skip the rows with gateway and worker in separate processes")
    p.add_argument("--no-ledger", dest="ledger", action="store_false",
                   help="skip the rows with the usage ledger on and off")
    p.add_argument("--model", default=None, help="tokenizer source dir (default: SmolLM2)")
    p.add_argument("--json", default=None, help="also write the rows here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from engine.model_files import load_tokenizer, resolve_model_dir
    from gateway.bus.embedded import EmbeddedRedis

    tokenizer = load_tokenizer(resolve_model_dir(args.model))
    loop_name = loop_factory()[0]
    direct = run_loop(direct_rows(tokenizer, args))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cpus = sorted(os.sched_getaffinity(0))
    with EmbeddedRedis() as redis:
        with serving(redis.url, port, args, ("all",)) as procs:
            key = run_loop(make_key(redis.url))
            pinned = (server_pids(procs[0], redis.url), cpus[:1]) \
                if args.pin and len(cpus) > 1 else None
            gw = run_loop(gateway_rows(url, key, args, pinned))
            if args.ledger:
                off_port = free_port()
                with serving(redis.url, off_port, args, ("all",), CARPOOL_LEDGER="0"):
                    gw += run_loop(ledger_rows(url, f"http://127.0.0.1:{off_port}", key,
                                               args))
        if args.split:
            port = free_port()
            with serving(redis.url, port, args, ("gateway", "worker")):
                gw += run_loop(split_rows(f"http://127.0.0.1:{port}", key, args))
    client = ("lean asyncio HTTP/1.1 keep-alive client (gateway/bench/client.py)"
              if args.client == "lean" else "httpx")
    print(f"carpool bench gateway: FAKE echo engine, {args.requests} requests, concurrency "
          f"{args.concurrency}, {args.step_ms:g} ms steps, {args.max_tokens} tokens each "
          f"(streamed-token rows: {args.stream_tokens}); open loop at {args.rate:g} req/s for "
          f"{args.duration:g} s; {len(cpus)} CPUs ({cpu_model()}) shared by client, gateway "
          f"and Redis "
          f"(pinned row: client on CPU {cpus[0]}, gateway and Redis on the rest; split-roles "
          f"rows: gateway and worker+engine in two processes)\n"
          f"load generator: {client} in the bench process; direct baseline and load generator "
          f"on {loop_name}, the gateway on uvicorn's default loop ({loop_name}); gateway "
          f"settings as served: access log off, span export {_export_state()}, echo steps "
          f"+-20% jitter\n")
    print(table(direct, gw, args))
    ledger_line(gw)
    if args.json:
        Path(args.json).write_text(json.dumps([{
            "name": r.name, "p50_ms": r.pct(0.5), "p99_ms": r.pct(0.99), "rps": r.rps,
            "tokens_per_s": r.tokens_per_s, "mean_ms": statistics.fmean(r.latencies_s) * 1000}
            for r in direct + gw], indent=2))
    return 0


def ledger_line(rows: list[Any]) -> None:
    """What the usage ledger adds: the on row's latency minus the off row's, same run."""
    on = [r for r in rows if r.name.endswith("ledger on")]
    off = [r for r in rows if r.name.endswith("ledger off")]
    if on and off:
        print(f"\nusage ledger: {on[0].pct(0.5) - off[0].pct(0.5):+.3f} ms p50, "
              f"{on[0].pct(0.99) - off[0].pct(0.99):+.3f} ms p99 (on minus off, "
              f"{len(on[0].latencies_s)} requests each, {LEDGER_ROUNDS} alternating rounds)")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "CPU model unknown"


def _export_state() -> str:
    """What the serving processes inherit: spans are built only when something exports them."""
    from gateway.config import GatewayConfig

    return "ON (an OTLP endpoint is set)" if GatewayConfig.from_env().otlp_endpoint else \
        "off (no OTLP endpoint set)"


if __name__ == "__main__":
    sys.exit(main())
