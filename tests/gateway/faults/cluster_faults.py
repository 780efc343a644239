"""Faults on a real Valkey Cluster (``gateway/bench/redis_servers.py``): a gateway and two
worker processes (the FAKE echo engine) on three masters with a replica each, the cluster's
topology read live (a failover changes which node is a master), a slot moved between
masters by hand as ``valkey-cli --cluster reshard`` does it, and clients whose every answer
is kept with its time and its ``Retry-After``."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import redis
from redis.crc import key_slot

from gateway.bench.redis_servers import ValkeyCluster, wait_until
from gateway.bus.keys import RedisKeys
from gateway.process import free_port
from tests.gateway.procs import Proc, spawn_all

# 20 ms a step: a 120-token stream lasts about 2.5 s, long enough to span a failover
ECHO = ["--echo-step-ms", "20"]
# The default visibility timeout (the tests' processes get 2 s otherwise): longer than a
# failover, so that entries of live workers are not reclaimed while their slot is away
# (docs/deployment.md, "Redis Cluster")
ENV = {"CARPOOL_VISIBILITY_TIMEOUT_S": "30"}


@dataclass
class Stack:
    url: str  # the gateway's
    redis_url: str
    ns: str
    gateway: Proc
    workers: list[tuple[Proc, int]]  # (process, metrics port)

    @property
    def keys(self) -> RedisKeys:
        return RedisKeys(self.ns)


@contextmanager
def stack(valkey: ValkeyCluster, model_dir: Path, tmp: Path) -> Iterator[Stack]:
    ns = f"cf{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]
    with spawn_all(valkey.url, ns, model_dir, tmp, ("gateway", ECHO),
                   *[("worker", [*ECHO, "--metrics-port", str(p)]) for p in ports],
                   env=ENV) as (gw, wa, wb):
        yield Stack(gw.url, valkey.url, ns, gw, [(wa, ports[0]), (wb, ports[1])])


# -- the cluster's live topology ---------------------------------------------------------

def _nodes_lines(valkey: ValkeyCluster) -> list[list[str]]:
    for node in valkey.nodes:
        if node.proc.poll() is not None:
            continue
        try:
            raw: Any = node.client.execute_command("CLUSTER", "NODES")
        except redis.RedisError:  # a node going down: ask the next
            continue
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return [line.split() for line in text.splitlines() if line.strip()]
    raise RuntimeError("no cluster node answers")


def _port(addr: str) -> int:
    return int(re.split(r"[:@]", addr)[1])


def masters(valkey: ValkeyCluster) -> list[Any]:
    """The nodes (``redis_servers.Node``) that are masters now and not marked failed."""
    by_port = {n.port: n for n in valkey.nodes}
    return [by_port[_port(f[1])] for f in _nodes_lines(valkey)
            if "master" in f[2] and "fail" not in f[2] and _port(f[1]) in by_port]


def owner(valkey: ValkeyCluster, slot: int) -> Any:
    """The node serving ``slot`` now (the cluster's own view, not a client's cache)."""
    by_port = {n.port: n for n in valkey.nodes}
    for f in _nodes_lines(valkey):
        if "master" not in f[2] or "fail" in f[2]:
            continue
        for part in f[8:]:
            if part.startswith("["):
                continue
            lo, _, hi = part.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                return by_port[_port(f[1])]
    raise LookupError(f"no master serves slot {slot}")


class Promotion(threading.Thread):
    """Polls the cluster from ``since`` (monotonic s) until a node other than ``victim``
    serves ``slot``: ``after_s``, how long that took (None if not within ``timeout_s``)."""

    def __init__(self, valkey: ValkeyCluster, slot: int, victim: Any, since: float,
                 timeout_s: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.valkey, self.slot, self.victim, self.since = valkey, slot, victim, since
        self.timeout_s = timeout_s
        self.after_s: float | None = None
        self.start()

    def run(self) -> None:
        while time.monotonic() - self.since < self.timeout_s:
            try:
                if owner(self.valkey, self.slot) is not self.victim:
                    self.after_s = time.monotonic() - self.since
                    return
            except LookupError:  # the victim marked failed, no master for it yet
                pass
            time.sleep(0.02)


def subscribed_nodes(valkey: ValkeyCluster) -> list[Any]:
    """The live nodes that hold a pub/sub subscriber (the workers' cancel listeners)."""
    found = []
    for node in valkey.nodes:
        if node.proc.poll() is not None:
            continue
        clients = node.client.client_list()
        if any(int(c.get("sub", 0)) > 0 for c in clients):
            found.append(node)
    return found


def wait_healthy(valkey: ValkeyCluster, timeout_s: float = 30.0) -> None:
    """Until the cluster has marked every dead node failed (a master's replica promoted)
    and every live node says it is ``ok`` (every slot served)."""
    dead = {n.port for n in valkey.nodes if n.proc.poll() is not None}

    def healthy() -> bool:
        failed = {_port(f[1]) for f in _nodes_lines(valkey) if "fail" in f[2].split(",")}
        return dead <= failed and all(n.info().get("cluster_state") == "ok"
                                      for n in valkey.nodes if n.proc.poll() is None)

    wait_until(healthy, time.monotonic() + timeout_s, "the failed-over cluster")


def live_url(valkey: ValkeyCluster) -> str:
    """A cluster URL through a live master (the test's own clients: the first master may be
    dead by now)."""
    return f"redis://127.0.0.1:{masters(valkey)[0].port}/?cluster=1"


def tenant_slot(keys: RedisKeys, tenant: str) -> int:
    return int(key_slot(keys.concurrency(tenant).encode()))


def tenant_on(valkey: ValkeyCluster, keys: RedisKeys, node: Any, prefix: str) -> str:
    """A tenant id whose shard's slot ``node`` serves."""
    for i in range(500):
        if owner(valkey, tenant_slot(keys, f"{prefix}{i}")) is node:
            return f"{prefix}{i}"
    raise LookupError("no tenant lands on that node")


def migrate_slot(valkey: ValkeyCluster, slot: int, src: Any, dst: Any,
                 pause_s: float = 0.05) -> int:
    """Move ``slot`` from ``src`` to ``dst`` one key at a time (``pause_s`` between keys, so
    that the slot stays half moved while its streams are written and read), then hand it to
    ``dst`` on every master: the keys moved."""
    dst.client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.node_id)
    src.client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.node_id)
    moved = 0
    while batch := src.client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
        src.client.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS",
                                   *batch)
        moved += len(batch)
        time.sleep(pause_s)
    for node in [dst, src, *(m for m in masters(valkey) if m not in (src, dst))]:
        node.client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)
    return moved


# -- clients ---------------------------------------------------------------------------

@dataclass
class Answer:
    started: float
    ended: float
    status: int | None  # None: no HTTP answer at all
    retry_after: str | None
    body: Any

    @property
    def clear(self) -> bool:
        """A 200, or a 503 with ``Retry-After`` and an OpenAI-style error body."""
        if self.status == 200:
            return True
        err = self.body.get("error") if isinstance(self.body, dict) else None
        return (self.status == 503 and bool(self.retry_after) and isinstance(err, dict)
                and bool(err.get("code")) and err.get("type") == "server_error")


def ask(client: httpx.Client, body: dict[str, Any]) -> Answer:
    started = time.monotonic()
    try:
        r = client.post("/v1/completions", json=body)
    except httpx.HTTPError as exc:
        return Answer(started, time.monotonic(), None, None, repr(exc))
    try:
        payload: Any = r.json()
    except ValueError:
        payload = r.text
    return Answer(started, time.monotonic(), r.status_code, r.headers.get("retry-after"),
                  payload)


class Clients:
    """``threads`` clients sending ``body`` in a loop until stopped, every answer kept."""

    def __init__(self, url: str, key: str, body: dict[str, Any], threads: int = 2) -> None:
        self.url, self.key, self.body = url, key, body
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True)
                         for _ in range(threads)]

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60,
                          headers={"Authorization": f"Bearer {self.key}"}) as client:
            while not self._stop.is_set():
                got = ask(client, self.body)
                self.answers.append(got)
                if got.status != 200:
                    time.sleep(0.05)

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(70)


def first_success(url: str, key: str, body: dict[str, Any], since: float, timeout: float
                  ) -> tuple[float, list[Answer]]:
    """Send ``body`` again and again until one is answered 200: (seconds from ``since`` to
    that answer, every answer)."""
    answers: list[Answer] = []
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=timeout,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        while time.monotonic() < deadline:
            got = ask(client, body)
            answers.append(got)
            if got.status == 200:
                return got.ended - since, answers
            time.sleep(0.05)
    raise TimeoutError(f"no request succeeded in {timeout} s: {answers[-3:]}")


# -- what must be left at the end ------------------------------------------------------

def engine_requests(port: int) -> float:
    """Requests inside a worker's engine (running + waiting: what holds KV blocks)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.findall(r'^carpool_engine_requests\{state="(?:running|waiting)"\} (\S+)', text,
                       re.MULTILINE)
    kv = re.search(r'^carpool_kv_blocks\{state="used"\} (\S+)', text, re.MULTILINE)
    return sum(float(v) for v in found) + (float(kv.group(1)) if kv else 0.0)


def leftovers(redis: Any, keys: RedisKeys, tenant: str, tiers: list[str]) -> dict[str, int]:
    """The tenant's quota leases (its concurrency zset) and queue entries still in Redis."""
    out = {"leases": int(redis.zcard(keys.concurrency(tenant)))}
    for tier in tiers:
        out[f"queue:{tier}"] = int(redis.xlen(keys.queue(tier, tenant)))
    return out


def ledger_tokens(redis: Any, keys: RedisKeys, tenant: str) -> int:
    """The completion tokens of ``tenant`` in the usage ledger (``tenancy/ledger.py``)."""
    from gateway.tenancy.ledger import rows_from_hash

    return sum(row.completion_tokens
               for key in redis.scan_iter(match=keys.usage(tenant, "*"))
               for row in rows_from_hash(tenant, "", redis.hgetall(key)))


def settle_to_zero(read: Any, timeout: float = 15.0) -> Any:
    """``read()`` again until every value is 0 (or ``timeout``): its last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        values = got.values() if isinstance(got, dict) else [got]
        if not any(values) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)
