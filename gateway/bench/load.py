"""The load generator of ``carpool bench gateway``: closed and open loops, the two clients'
calls (the lean one of ``client.py`` and httpx), and CPU pinning for the pinned row."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any


async def closed_loop(n: int, concurrency: int, one: Any) -> tuple[list[float], float, int]:
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


async def open_loop(rate: float, duration_s: float, one: Any) -> tuple[list[float], float]:
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


PROMPT = "The quick brown fox jumps over the lazy dog"


def completion_body(max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "echo", "max_tokens": max_tokens, "stream": stream,
                            "prompt": PROMPT}
    if stream:  # events may carry several tokens: count them from the usage chunk
        body["stream_options"] = {"include_usage": True}
    return body


def usage_tokens(sse_text: str) -> int:
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
    from gateway.bench.client import LeanClient

    host, port = url.removeprefix("http://").split(":")
    client = LeanClient(host, int(port), {"Authorization": f"Bearer {key}"})

    def completion(max_tokens: int, stream: bool) -> Any:
        body = completion_body(max_tokens, stream)

        async def one() -> int:
            r = await client.post_json("/v1/completions", body)
            if stream:
                return usage_tokens(r.body.decode())
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
            body = completion_body(max_tokens, stream)

            async def one() -> int:
                if not stream:
                    r = await client.post("/v1/completions", json=body)
                    r.raise_for_status()
                    return int(r.json()["usage"]["completion_tokens"])
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    r.raise_for_status()
                    return usage_tokens("\n".join([line async for line in r.aiter_lines()]))
            return one

        async def floor() -> int:
            (await client.get("/healthz")).raise_for_status()
            return 0

        yield Calls(completion, floor)


def server_pids(proc: subprocess.Popen[bytes], redis_url: str) -> list[int]:
    """The gateway process and the Redis server (its pid from INFO)."""
    from gateway.bus.client import sync_redis_client

    client = sync_redis_client(redis_url)
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
