"""The deployment-wide stats: two processes' registries published into one real Redis and read
back as one picture. The reference is a third registry that saw every observation of both:
merged counters and histogram buckets must equal its own, shared gauges (the queues) are not
double counted, engine gauges add up, and a quantile lands in the bucket that holds the true
quantile of the raw observations."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from gateway.bus.keys import RedisKeys
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.stats_publish import (
    MetricsPublisher,
    parse_samples,
    read_published,
    watch,
)
from gateway.telemetry.stats_snapshot import Point, StatsHistory
from gateway.telemetry.stats_window import buckets, delta, merge, total
from policies.tiers import TIERS

TTFT = "gen_ai_server_time_to_first_token_seconds"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def observe(metrics: list[Metrics], values: list[float], tenant: str) -> None:
    for m in metrics:
        for x in values:
            m.ttft.labels("interactive").observe(x)
            m.tenant_ttft.labels(tenant).observe(x)
        m.requests.labels("interactive", tenant, "stop").inc(len(values))
        m.tokens.labels("interactive", "completion").inc(10 * len(values))
        m.tenant_tokens.labels(tenant, "completion").inc(10 * len(values))


def engine_gauges(m: Metrics, seats: int, used: int, free: int) -> None:
    m.engine_seats.set(seats)
    m.kv_blocks.labels("used").set(used)
    m.kv_blocks.labels("free").set(free)
    m.queue_depth.labels("interactive").set(7)  # each worker samples the same shared queue


def reference_buckets(ref: Metrics) -> list[tuple[float, float]]:
    fam = next(f for f in text_string_to_metric_families(ref.render().decode())
               if f.name == TTFT)
    return sorted((float(s.labels["le"]), s.value) for s in fam.samples
                  if s.name.endswith("_bucket"))


def containing_bucket(cum: list[tuple[float, float]], value: float) -> tuple[float, float]:
    lower = 0.0
    for bound, _ in cum:
        if value <= bound:
            return lower, bound
        lower = bound
    return lower, float("inf")


async def test_two_publishers_one_picture(redis: Any) -> None:
    keys = RedisKeys(f"t{uuid.uuid4().hex[:10]}")
    a, b, ref = Metrics(), Metrics(), Metrics()
    rng = random.Random(4)
    obs_a = [rng.uniform(0.001, 3.0) for _ in range(200)]
    obs_b = [rng.expovariate(4.0) for _ in range(150)]
    observe([a, ref], obs_a, "acme")
    observe([b, ref], obs_b, "zeta")
    engine_gauges(a, 16, used=10, free=54)
    engine_gauges(b, 8, used=3, free=29)
    for m, proc in ((a, "w1"), (b, "w2")):
        await MetricsPublisher(redis, keys, m.registry, "worker", proc=proc).publish()

    stats = await StatsHistory(redis, keys, TIERS).snapshot()

    assert stats["processes"] == {"w1": "worker", "w2": "worker"}
    tier = stats["tiers"]["interactive"]
    assert tier["counts"]["finished"] == len(obs_a) + len(obs_b)
    assert tier["ttft_s"]["count"] == len(obs_a) + len(obs_b)
    assert tier["queue_depth"] == 7  # the shared queue, once
    assert stats["engine"]["max_num_seqs"] == 24 and stats["engine"]["kv_total"] == 96
    assert stats["engine"]["kv_used"] == 13
    # merged buckets == the buckets of a registry that saw everything
    procs = {p: pub.samples for p, pub in (await read_published(redis, keys)).items()}
    assert buckets(merge(procs.values()), TTFT, tier="interactive") == reference_buckets(ref)
    # the reported quantiles sit in the bucket of the raw observations' true quantile
    everything = obs_a + obs_b
    cum = reference_buckets(ref)
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        lo, hi = containing_bucket(cum, float(np.quantile(everything, q)))
        assert lo <= tier["ttft_s"][key] <= hi
    shares = {r["tenant"]: r["share"] for r in stats["tenants"]}
    assert shares["acme"] == pytest.approx(len(obs_a) / len(everything), abs=1e-4)


async def test_window_counts_only_what_changed(redis: Any) -> None:
    keys = RedisKeys(f"t{uuid.uuid4().hex[:10]}")
    a, b = Metrics(), Metrics()
    observe([a], [0.1] * 30, "acme")
    pubs = [MetricsPublisher(redis, keys, m.registry, "all", proc=p)
            for m, p in ((a, "g1"), (b, "g2"))]
    for p in pubs:  # long-running processes: their counters' zero is older than any window
        p.start -= 3600
    history = StatsHistory(redis, keys, TIERS)
    for p in pubs:
        await p.publish()
    await history.sample()
    await asyncio.sleep(0.05)  # two samples a little apart: the window is their distance
    observe([a], [0.2] * 4, "acme")
    observe([b], [0.3] * 6, "zeta")
    for p in pubs:
        await p.publish()
    await history.sample()
    stats = await history.snapshot()
    window = stats["window_s"]
    assert window > 0
    tier = stats["tiers"]["interactive"]
    assert tier["counts"]["finished"] == 10
    assert tier["completed_per_s"] == pytest.approx(10 / window, rel=0.05)  # window rounded


async def test_young_processes_count_from_their_start(redis: Any) -> None:
    """Every process started within the window: the window runs from the first start, whose
    counters were zero, so a first read already has it all."""
    keys = RedisKeys(f"t{uuid.uuid4().hex[:10]}")
    a = Metrics()
    pub = MetricsPublisher(redis, keys, a.registry, "all", proc="young")
    pub.start -= 20
    observe([a], [0.1] * 7, "acme")
    await pub.publish()
    stats = await StatsHistory(redis, keys, TIERS).snapshot()
    assert stats["tiers"]["interactive"]["counts"]["finished"] == 7
    assert 20 <= stats["window_s"] < 30


async def test_processes_publish_only_while_watched(redis: Any) -> None:
    keys = RedisKeys(f"t{uuid.uuid4().hex[:10]}")
    pub = MetricsPublisher(redis, keys, Metrics().registry, "worker", proc="w",
                           interval_s=0.05)
    task = asyncio.create_task(pub.run())
    try:
        await asyncio.sleep(0.3)
        assert await redis.hkeys(keys.metrics) == []  # nobody watches: nothing spent
        await watch(redis, keys)
        for _ in range(100):
            if await redis.hkeys(keys.metrics):
                break
            await asyncio.sleep(0.05)
        assert await redis.hkeys(keys.metrics) == [b"w"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_a_window_starts_where_every_process_is_known() -> None:
    now = Point(100.0, {"a": {}, "b": {}}, {}, {"a": 0.0, "b": 95.0})
    assert Point(90.0, {"a": {}}, {}, {"a": 0.0}).covers(now)  # b started after it
    assert not Point(96.0, {"a": {}}, {}, {"a": 0.0}).covers(now)  # b ran, unseen
    assert not Point(90.0, {"b": {}}, {}, {"b": 95.0}).covers(now)  # a ran, unseen


async def test_stale_process_is_left_out_and_deleted(redis: Any) -> None:
    keys = RedisKeys(f"t{uuid.uuid4().hex[:10]}")
    await MetricsPublisher(redis, keys, Metrics().registry, "worker", proc="live").publish()
    dead = {"proc": "dead", "role": "worker", "ts": time.time() - 60, "start": 0.0,
            "samples": []}
    await redis.hset(keys.metrics, "dead", orjson.dumps(dead))
    await redis.hset(keys.metrics, "junk", b"not json")
    assert set(await read_published(redis, keys)) == {"live"}
    assert set(await redis.hkeys(keys.metrics)) == {b"live"}


def test_a_restarted_process_counts_from_zero() -> None:
    def samples(n: float) -> dict[str, Any]:
        return parse_samples([["carpool_requests_total", {"tier": "batch"}, n]])

    then = {"p": samples(100.0), "gone": samples(5.0)}
    now = {"p": samples(3.0), "new": samples(2.0)}  # p restarted; new appeared
    assert total(delta(now, then), "carpool_requests_total") == 3.0 + 2.0
    assert total(delta({"p": samples(104.0)}, then), "carpool_requests_total") == 4.0
