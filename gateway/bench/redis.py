"""carpool bench redis: what Redis does per streamed token, on one server and on a
three-master Valkey Cluster (the embedded binary, ``redis_servers.py``), with the FAKE echo
engine served by ``carpool serve`` (gateway + worker in one process).

Each row: ``--tenants`` tenants, ``--streams`` concurrent streaming requests of ``--tokens``
tokens from them, run twice (the first fills the connection pools); the second batch is
measured with every node's ``INFO commandstats``: server-side commands (a script's inner
commands included) per streamed token, commands per second per node, the busiest node's share
and the token rate. From the per-token cost: the token rate one node would saturate at,
taking ``--node-commands-s`` commands per second as a node's capacity."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from gateway.bench.gateway import SECRET, cpu_model, serving
from gateway.process import free_port


def _calls(client: Any) -> int:
    return sum(v["calls"] for v in client.info("commandstats").values())


async def _tenants(url: str, n: int) -> list[str]:
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.tenants import Tenant, TenantStore

    client = redis_client(url)
    try:
        store = TenantStore(client, RedisKeys("bench"), SECRET.encode())
        keys = []
        for i in range(n):
            await store.put(Tenant(f"tenant{i}"))
            keys.append((await store.issue_key(f"tenant{i}"))[0])
        return keys
    finally:
        await client.aclose()


async def _batch(base: str, keys: list[str], streams: int, tokens: int) -> int:
    import httpx

    body = {"model": "any", "prompt": "one two three", "max_tokens": tokens, "stream": True,
            "ignore_eos": True}

    async def one(c: Any, key: str) -> int:
        got = 0
        async with c.stream("POST", "/v1/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as s:
            async for line in s.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    got += 1
        return got

    async with httpx.AsyncClient(base_url=base, timeout=120) as c:
        body["model"] = (await c.get("/v1/models", headers={
            "Authorization": f"Bearer {keys[0]}"})).json()["data"][0]["id"]
        return sum(await asyncio.gather(*(one(c, keys[i % len(keys)])
                                          for i in range(streams))))


def _row(masters: int, args: argparse.Namespace) -> dict[str, Any]:
    import redis as sync_redis

    from gateway.bench.redis_servers import ValkeyCluster
    from gateway.bus.embedded import EmbeddedRedis

    cluster = ValkeyCluster(masters=masters) if masters > 1 else None
    single = EmbeddedRedis() if masters == 1 else None
    url = cluster.start().url if cluster else single.start()  # type: ignore[union-attr]
    try:
        nodes = ([n.client for n in cluster.masters] if cluster
                 else [sync_redis.Redis.from_url(url)])
        port = free_port()
        with serving(url, port, args, ("all",)):
            keys = asyncio.run(_tenants(url, args.tenants))
            base = f"http://127.0.0.1:{port}"
            asyncio.run(_batch(base, keys, args.streams, args.tokens))
            before = [_calls(n) for n in nodes]
            t0 = time.monotonic()
            asyncio.run(_batch(base, keys, args.streams, args.tokens))
            secs = time.monotonic() - t0
            per_node = [_calls(n) - b for n, b in zip(nodes, before)]
    finally:
        if cluster:
            cluster.stop()
        if single:
            single.stop()
    total, toks = sum(per_node), args.streams * args.tokens
    return {"masters": masters, "per_token": total / toks, "tokens_s": toks / secs,
            "node_s": [n / secs for n in per_node], "top_share": max(per_node) / total}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="carpool bench redis", description=__doc__)
    p.add_argument("--tenants", type=int, default=32)
    p.add_argument("--streams", type=int, default=32, help="concurrent streams (one worker)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=5.0, help="echo engine step time")
    p.add_argument("--model", default=None, help="tokenizer source dir (default: SmolLM2)")
    p.add_argument("--node-commands-s", type=float, default=100_000.0,
                   help="a node's capacity in commands per second, for the saturation column")
    args = p.parse_args(argv)
    rows = [_row(m, args) for m in (1, 3)]
    print(f"carpool bench redis: FAKE echo engine ({args.step_ms:g} ms steps), one gateway + "
          f"worker process, {args.tenants} tenants, {args.streams} streams x {args.tokens} "
          f"tokens (second batch measured); {cpu_model()}\n")
    print("| masters | commands / token | tokens / s | commands / s per node | busiest node "
          "| tokens / s one node saturates at |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        nodes = ", ".join(f"{n:,.0f}" for n in r["node_s"])
        print(f"| {r['masters']} | {r['per_token']:.2f} | {r['tokens_s']:,.0f} | {nodes} | "
              f"{r['top_share']:.0%} | {args.node_commands_s / r['per_token']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
