"""``carpool bench gateway``: what the gateway adds on top of an instant engine.

The engine is the FAKE echo engine (no model), so every millisecond measured is gateway:
HTTP, auth, tokenization, the Lua admission, the Redis queue, the worker, the per-step
pipelined output write and the relay back. One run, one table, ratios against baselines
measured in the same run on the same machine:
  direct     ``FakeEchoEngine.generate`` called in-process (no HTTP, no Redis)
  http-floor ``GET /healthz`` through the same uvicorn process (the HTTP client+server cost)
The gateway runs as its own process (``carpool serve --engine echo``); the load generator is
this process, so on a small machine both share the CPUs. By default it is the lean asyncio
HTTP/1.1 keep-alive client of ``bench_client.py`` (``--client httpx`` for the heavier httpx);
whatever it costs is still counted as gateway latency. The direct baseline and the load
generator run on the same event loop implementation as the gateway's uvicorn (uvloop when
installed), so the FAKE engine's step timer behaves the same on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


async def _closed_loop(n: int, concurrency: int, one: Any) -> tuple[list[float], float, int]:
    """``n`` calls of ``one()`` with ``concurrency`` in flight; returns latencies, wall, tokens."""
    latencies: list[float] = []
    tokens = 0
    it = iter(range(n))

    async def lane() -> None:
        nonlocal tokens
        for _ in it:
            t0 = time.perf_counter()
            n = await one()
            latencies.append(time.perf_counter() - t0)
            tokens += n

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start, tokens


async def _open_loop(rate: float, duration_s: float, one: Any) -> tuple[list[float], float]:
    """Requests started at a fixed ``rate`` regardless of completions (latency under load)."""
    latencies: list[float] = []

    async def timed() -> None:
        t0 = time.perf_counter()
        await one()
        latencies.append(time.perf_counter() - t0)

    tasks, start = [], time.perf_counter()
    for i in range(int(rate * duration_s)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed()))
    await asyncio.gather(*tasks)
    return latencies, time.perf_counter() - start


async def direct_rows(tokenizer: Any, args: argparse.Namespace) -> list[Row]:
    from engine.sampling_params import SamplingParams
    from gateway.echo_engine import FakeEchoEngine

    engine = FakeEchoEngine(tokenizer, step_ms=args.step_ms)
    await engine.start()
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog",
                              add_special_tokens=False)
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
    lat, wall, tok = await _closed_loop(args.requests, args.concurrency, call(args.max_tokens))
    rows.append(Row("direct (in-process engine.generate)", lat, wall, tok))
    lat, wall, tok = await _closed_loop(args.concurrency * 2, args.concurrency,
                                        call(args.stream_tokens))
    rows.append(Row("direct streamed tokens", lat, wall, tok))
    lat, wall = await _open_loop(args.rate, args.duration, call(args.max_tokens))
    rows.append(Row(f"direct @ {args.rate:g} req/s", lat, wall))
    await engine.shutdown()
    return rows


PROMPT = "The quick brown fox jumps over the lazy dog"


def _body(max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "echo", "max_tokens": max_tokens, "stream": stream,
                            "prompt": PROMPT}
    if stream:  # events may carry several tokens: count them from the usage chunk
        body["stream_options"] = {"include_usage": True}
    return body


def _usage_tokens(sse_text: str) -> int:
    n = 0
    for line in sse_text.splitlines():
        if line.startswith('data: {') and '"usage"' in line:
            n = int(json.loads(line[6:])["usage"]["completion_tokens"])
    return n


@dataclass
class Calls:
    """The load generator's two calls: a completion factory and the HTTP floor."""

    completion: Callable[[int, bool], Callable[[], Awaitable[int]]]
    floor: Callable[[], Awaitable[int]]


@contextlib.asynccontextmanager
async def lean_calls(url: str, key: str, args: argparse.Namespace) -> AsyncIterator[Calls]:
    from gateway.bench_client import LeanClient

    host, port = url.removeprefix("http://").split(":")
    client = LeanClient(host, int(port), {"Authorization": f"Bearer {key}"})

    def completion(max_tokens: int, stream: bool) -> Any:
        body = _body(max_tokens, stream)

        async def one() -> int:
            r = await client.post_json("/v1/completions", body)
            if stream:
                return _usage_tokens(r.body.decode())
            return int(r.json()["usage"]["completion_tokens"])
        return one

    async def floor() -> int:
        await client.get("/healthz")
        return 0

    try:
        yield Calls(completion, floor)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def httpx_calls(url: str, key: str, args: argparse.Namespace) -> AsyncIterator[Calls]:
    import httpx

    limits = httpx.Limits(max_connections=args.concurrency * 4, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 limits=limits, timeout=60) as client:
        def completion(max_tokens: int, stream: bool) -> Any:
            body = _body(max_tokens, stream)

            async def one() -> int:
                if not stream:
                    r = await client.post("/v1/completions", json=body)
                    r.raise_for_status()
                    return int(r.json()["usage"]["completion_tokens"])
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    r.raise_for_status()
                    return _usage_tokens("\n".join([line async for line in r.aiter_lines()]))
            return one

        async def floor() -> int:
            (await client.get("/healthz")).raise_for_status()
            return 0

        yield Calls(completion, floor)


async def gateway_rows(url: str, key: str, args: argparse.Namespace,
                       pinned: tuple[list[int], list[int]] | None = None) -> list[Row]:
    make = lean_calls if args.client == "lean" else httpx_calls
    async with make(url, key, args) as calls:
        completion = calls.completion
        await _closed_loop(64, 8, completion(args.max_tokens, False))  # warm-up
        rows = []
        for name, fn in (("http-floor (GET /healthz)", calls.floor),
                         ("gateway non-streaming", completion(args.max_tokens, False)),
                         ("gateway streaming", completion(args.max_tokens, True))):
            lat, wall, tok = await _closed_loop(args.requests, args.concurrency, fn)
            rows.append(Row(name, lat, wall, tok))
        lat, wall, tok = await _closed_loop(args.concurrency * 2, args.concurrency,
                                            completion(args.stream_tokens, True))
        rows.append(Row("gateway streamed tokens", lat, wall, tok))
        lat, wall = await _open_loop(args.rate, args.duration, completion(args.max_tokens, False))
        rows.append(Row(f"gateway @ {args.rate:g} req/s", lat, wall))
        if pinned is not None:  # the same, the client on one core and the server on the other
            with pin(*pinned):
                lat, wall = await _open_loop(args.rate, args.duration,
                                             completion(args.max_tokens, False))
            rows.append(Row(f"gateway @ {args.rate:g} req/s, client pinned apart", lat, wall))
    return rows


def server_pids(proc: subprocess.Popen[bytes], redis_url: str) -> list[int]:
    """The gateway process and the Redis server (its pid from INFO)."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_url)
    try:
        return [proc.pid, int(client.info("server")["process_id"])]
    finally:
        client.close()


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


@contextlib.contextmanager
def pin(server_pids: list[int], client_cpus: list[int]) -> Iterator[None]:
    """Every thread of ``server_pids`` on the CPUs not in ``client_cpus``, this thread (the
    load generator's loop) on ``client_cpus``; the old masks come back afterwards."""
    everything = os.sched_getaffinity(0)
    server_cpus = everything - set(client_cpus)
    tids = [t for pid in server_pids for t in _threads(pid)]
    try:
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, server_cpus)
        os.sched_setaffinity(0, set(client_cpus))
        yield
    finally:
        os.sched_setaffinity(0, everything)
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, everything)


def start_gateway(redis_url: str, port: int, model: str | None,
                  step_ms: float) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--engine", "echo", "--port", str(port),
           "--no-demo", "--namespace", "bench", "--echo-step-ms", str(step_ms)]
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "REDIS_URL": redis_url, "CARPOOL_SECRET": SECRET}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
    import redis.asyncio as aioredis

    from gateway.redis_keys import RedisKeys
    from gateway.tenants import Tenant, TenantStore

    client = aioredis.Redis.from_url(redis_url)
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


def main(argv: list[str] | None = None) -> int:
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
    p.add_argument("--model", default=None, help="tokenizer source dir (default: SmolLM2)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)

    from engine.model_loader import load_tokenizer, resolve_model_dir
    from gateway.redis_server import EmbeddedRedis

    tokenizer = load_tokenizer(resolve_model_dir(args.model))
    loop_name, run = _runner()
    direct = run(direct_rows(tokenizer, args))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cpus = sorted(os.sched_getaffinity(0))
    with EmbeddedRedis() as redis:
        proc = start_gateway(redis.url, port, args.model, args.step_ms)
        try:
            wait_ready(url, proc)
            key = run(make_key(redis.url))
            pinned = (server_pids(proc, redis.url), cpus[:1]) if args.pin and len(cpus) > 1 \
                else None
            gw = run(gateway_rows(url, key, args, pinned))
        finally:
            proc.terminate()
            proc.wait(15)
    client = ("lean asyncio HTTP/1.1 keep-alive client (gateway/bench_client.py)"
              if args.client == "lean" else "httpx")
    print(f"carpool bench gateway: FAKE echo engine, {args.requests} requests, concurrency "
          f"{args.concurrency}, {args.step_ms:g} ms steps, {args.max_tokens} tokens each "
          f"(streamed-token rows: {args.stream_tokens}); open loop at {args.rate:g} req/s for "
          f"{args.duration:g} s; {len(cpus)} CPUs shared by client, gateway and Redis "
          f"(pinned row: client on CPU {cpus[0]}, gateway and Redis on the rest)\n"
          f"load generator: {client} in the bench process; direct baseline and load generator "
          f"on {loop_name}, the gateway on uvicorn's default loop ({loop_name})\n")
    print(table(direct, gw, args))
    if args.json:
        Path(args.json).write_text(json.dumps([{
            "name": r.name, "p50_ms": r.pct(0.5), "p99_ms": r.pct(0.99), "rps": r.rps,
            "tokens_per_s": r.tokens_per_s, "mean_ms": statistics.fmean(r.latencies_s) * 1000}
            for r in direct + gw], indent=2))
    return 0


def _runner() -> tuple[str, Callable[[Any], Any]]:
    """Run coroutines on uvloop when installed: what uvicorn picks for the gateway too."""
    try:
        import uvloop
    except ImportError:
        return "asyncio", asyncio.run

    def run(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return "uvloop", run


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
