"""The fleet and the counters of ``carpool bench redis``: one gateway and ``workers`` worker
processes (``carpool serve --role ...``, the FAKE echo engine) on one server or a Valkey
Cluster (``redis_servers.py``), streaming requests from many tenants, and every node's
``INFO commandstats`` (a script's inner commands included) and ``INFO cpu`` around a batch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.bench.gateway import SECRET, start_server, wait_ready
from gateway.process import free_port, stop_children


@dataclass
class Sample:
    """What the nodes did over a batch: per node, commands by name and CPU seconds."""

    commands: list[Counter[str]] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    secs: float = 0.0
    tokens: int = 0


def node_counters(client: Any) -> tuple[Counter[str], float]:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    return (Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}),
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))


def measure(nodes: list[Any], run: Any) -> Sample:
    """Run ``run()`` (returns the tokens streamed) between two reads of every node."""
    before = [node_counters(n) for n in nodes]
    t0 = time.monotonic()
    tokens = run()
    secs = time.monotonic() - t0
    after = [node_counters(n) for n in nodes]
    # the second read's own INFO calls are not the load's
    return Sample([a[0] - b[0] - Counter({"info": 2}) for a, b in zip(after, before)],
                  [a[1] - b[1] for a, b in zip(after, before)], secs, tokens)


async def make_tenants(url: str, n: int, have: list[str]) -> list[str]:
    """API keys of tenants ``tenant0``..``tenant{n-1}`` (``have``: the first ones, made
    before), made 200 at a time."""
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.tenants import Tenant, TenantStore

    client = redis_client(url)
    try:
        store = TenantStore(client, RedisKeys("bench"), SECRET.encode())

        async def one(i: int) -> str:
            await store.put(Tenant(f"tenant{i}"))
            return str((await store.issue_key(f"tenant{i}"))[0])

        keys = list(have)
        for lo in range(len(keys), n, 200):
            keys += await asyncio.gather(*(one(i) for i in range(lo, min(n, lo + 200))))
        return keys
    finally:
        await client.aclose()


async def stream_batch(base: str, keys: list[str], streams: int, tokens: int,
                       offset: int) -> int:
    """``streams`` concurrent streaming requests of ``tokens`` tokens, request i from tenant
    ``keys[(offset + i) % len(keys)]``; the tokens streamed: ``tokens`` per stream that ended
    with ``[DONE]`` (an SSE event may carry more than one token)."""
    import httpx

    body: dict[str, Any] = {"prompt": "one two three", "max_tokens": tokens, "stream": True,
                            "ignore_eos": True}

    async def one(c: Any, key: str) -> int:
        async with c.stream("POST", "/v1/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as s:
            async for line in s.aiter_lines():
                if line == "data: [DONE]":
                    return tokens
        return 0

    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as c:
        body["model"] = (await c.get("/v1/models", headers={
            "Authorization": f"Bearer {keys[0]}"})).json()["data"][0]["id"]
        return sum(await asyncio.gather(*(one(c, keys[(offset + i) % len(keys)])
                                          for i in range(streams))))


@contextlib.contextmanager
def fleet(url: str, workers: int, args: argparse.Namespace) -> Iterator[str]:
    """A gateway and ``workers`` workers (``args.streams`` rows each) on ``url``; yields the
    gateway's base URL."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start_server(url, port, args, "gateway"))
        worker_args = argparse.Namespace(**{**vars(args), "extra": [
            "--max-num-seqs", str(args.streams)]})
        procs += [start_server(url, free_port(), worker_args, "worker")
                  for _ in range(workers)]
        wait_ready(f"http://127.0.0.1:{port}", procs[0])
        yield f"http://127.0.0.1:{port}"
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a bench process exited ({p.returncode})")
    finally:
        stop_children(procs, 15)
