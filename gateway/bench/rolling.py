"""``carpool bench rolling``: a rolling restart under steady streaming load.

Two gateways and three workers (``carpool serve --role ...`` processes) on one Redis serve
greedy streams from a few client threads. Once ``--before`` seconds of steady load have been
measured, every worker and then every gateway is replaced one at a time, as a Deployment with
``maxSurge: 1, maxUnavailable: 0`` does: the new process is started and ready, then the old
one gets SIGTERM (a gateway leaves the clients' rotation first, as a pod leaves its Service's
endpoints) and is waited for. The load goes on until the roll is over.

Each stream is checked against an uninterrupted run of its prompt (greedy: the same text and
token counts, so nothing lost, repeated or reordered); a client-visible error is any status
but 200, an error event, or a stream without ``[DONE]``. A connection refused before any
answer is retried on the other gateway (what a load balancer does) and counted apart. At the
end: leases, pending queue entries and output streams left in Redis, and KV blocks still used
on each worker, all of which must be 0. TTFT and TPOT p50/p99 are reported for the requests
started before the roll and during it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench.sla import cpu_model
from gateway.process import child_env, free_port, stop_children

SECRET = "bench-rolling-secret"
NAMESPACE = "benchroll"
PROMPTS = ["Once upon a time", "The capital of France", "def main():", "In 1905, Einstein",
           "The quick brown fox", "Dear diary,"]


@dataclass
class Member:
    role: str
    popen: subprocess.Popen[bytes]
    port: int  # HTTP (gateway) or /metrics (worker)
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


@dataclass
class Result:
    phase: str
    ok: bool
    error: str = ""
    ttft_s: float | None = None
    tpot_s: float | None = None
    retried_connects: int = 0


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    leftovers: dict[str, int] = field(default_factory=dict)
    kv_used: list[int] = field(default_factory=list)
    handed_off: int = 0
    resumed: int = 0
    roll_s: float = 0.0

    def errors(self) -> list[str]:
        return [r.error for r in self.results if not r.ok]


class Fleet:
    """The processes, started and stopped as a rolling update does."""

    def __init__(self, redis_url: str, model: str, serve_args: list[str], folder: Path,
                 gateway_drain_s: float, worker_drain_s: float) -> None:
        self.redis_url, self.model, self.serve_args = redis_url, model, serve_args
        self.folder = folder
        self.drain = {"gateway": gateway_drain_s, "worker": worker_drain_s}
        self.gateways: list[Member] = []
        self.workers: list[Member] = []
        self.rotation: list[Member] = []  # the gateways clients are sent to
        self._n = itertools.count()

    def start(self, role: str) -> Member:
        port = free_port()
        cmd = [sys.executable, "-m", "gateway.cli.main", "serve", "--role", role,
               "--model", self.model, "--no-demo", "--namespace", NAMESPACE,
               "--drain-timeout", str(self.drain[role]), *self.serve_args,
               *(["--port", str(port)] if role == "gateway" else ["--metrics-port", str(port)])]
        log = self.folder / f"{role}-{next(self._n)}.log"
        env = child_env(REDIS_URL=self.redis_url, CARPOOL_SECRET=SECRET,
                        CARPOOL_STATE_DIR=str(self.folder), PYTHONUNBUFFERED="1")
        with log.open("wb") as out:
            popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        member = Member(role, popen, port, log)
        wait_http(member, "/readyz" if role == "gateway" else "/metrics", 180)
        if role == "worker":
            time.sleep(1.5)  # its first tier status: others can see it alive
            self.workers.append(member)
        else:
            self.gateways.append(member)
            self.rotation.append(member)
        return member

    def replace(self, old: Member) -> int:
        """Start the successor, then stop ``old``; its exit status."""
        self.start(old.role)
        if old.role == "worker":
            wait_busy(old, 10.0)  # a worker with streams in flight: its drain has work to do
        if old in self.rotation:
            self.rotation.remove(old)
            time.sleep(0.5)  # connections being opened to it land first (a preStop hook)
        old.popen.send_signal(signal.SIGTERM)
        try:
            code = old.popen.wait(self.drain[old.role] + 30)
        except subprocess.TimeoutExpired:
            old.popen.kill()
            code = old.popen.wait()
        (self.gateways if old.role == "gateway" else self.workers).remove(old)
        return code

    def stop_all(self) -> None:
        stop_children([m.popen for m in self.gateways + self.workers])


def wait_http(member: Member, path: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if member.popen.poll() is not None:
            raise RuntimeError(f"{member.role} exited:\n" + "\n".join(member.lines()[-30:]))
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(member.url + path, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{member.role} {member.url}{path} not ready in {timeout:.0f} s")


def stream_once(fleet: Fleet, key: str, body: dict[str, Any], expected: dict[str, Any] | None,
                phase: str, turn: int) -> Result:
    """One streaming completion through a gateway in rotation (refused connects retried)."""
    import httpx

    retried = 0
    for attempt in itertools.count():
        gateways = list(fleet.rotation)
        gw = gateways[(turn + attempt) % len(gateways)]
        t0 = time.monotonic()
        stamps: list[float] = []
        text: list[str] = []
        usage: dict[str, Any] | None = None
        errors: list[Any] = []
        done = False
        try:
            with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60,
                              headers={"Authorization": f"Bearer {key}"}) as resp:
                if resp.status_code != 200:
                    return Result(phase, False, f"status {resp.status_code}: "
                                  f"{resp.read()[:200]!r}", retried_connects=retried)
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        errors.append(event["error"])
                    if event.get("usage"):
                        usage = event["usage"]
                    if event.get("choices") and event["choices"][0].get("text"):
                        text.append(event["choices"][0]["text"])
                        stamps.append(time.monotonic())
        except httpx.ConnectError:
            if attempt < 10:  # never admitted: a load balancer retries elsewhere
                retried += 1
                time.sleep(0.05)
                continue
            return Result(phase, False, "connect refused 10 times", retried_connects=retried)
        except httpx.HTTPError as exc:
            return Result(phase, False, repr(exc), retried_connects=retried)
        break
    ttft = stamps[0] - t0 if stamps else None
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
    got = _outcome("".join(text), usage)
    error = ("" if done and not errors else f"errors {errors}, done={done}")
    if not error and expected is not None and got != expected:
        error = f"mismatch: {got} != {expected}"
    return Result(phase, not error, error, ttft, tpot, retried)


class Load:
    """``clients`` threads, each sending one stream after another until stopped."""

    def __init__(self, fleet: Fleet, key: str, bodies: list[dict[str, Any]],
                 expected: list[dict[str, Any]], clients: int) -> None:
        self.fleet, self.key, self.bodies, self.expected = fleet, key, bodies, expected
        self.phase = "before"
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._turn = itertools.count()
        self._threads = [threading.Thread(target=self._client, daemon=True)
                         for _ in range(clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _client(self) -> None:
        while not self._stop.is_set():
            turn = next(self._turn)
            i = turn % len(self.bodies)
            self.results.append(stream_once(self.fleet, self.key, self.bodies[i],
                                            self.expected[i], self.phase, turn))


async def make_key(redis_url: str) -> str:
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.tenants import Tenant, TenantStore

    client = redis_client(redis_url)
    try:
        store = TenantStore(client, RedisKeys(NAMESPACE), SECRET.encode())
        await store.put(Tenant("roll"))  # the default quota: no limits
        key, _ = await store.issue_key("roll")
        return key
    finally:
        await client.aclose()


def leftovers(redis_url: str) -> dict[str, int]:
    """Leases, pending queue entries and output streams still in Redis."""
    import redis as sync_redis

    from gateway.bus.client import text
    from gateway.bus.keys import GROUP, RedisKeys
    from policies.tiers import TIERS

    keys = RedisKeys(NAMESPACE)
    r = sync_redis.Redis.from_url(redis_url)
    try:
        leases = sum(int(r.zcard(k)) for k in r.scan_iter(f"{NAMESPACE}:*:conc:*"))
        pending = 0
        for tier in TIERS:
            tenants = [t for s in keys.shard_range() for t in r.smembers(keys.queue_tenants(tier, s))]
            for tenant in tenants:
                with contextlib.suppress(sync_redis.ResponseError):
                    pending += int(r.xpending(keys.queue(tier, text(tenant)),
                                              GROUP)["pending"])
        outs = sum(1 for _ in r.scan_iter(f"{NAMESPACE}:*:out:*"))
    finally:
        r.close()
    return {"leases": leases, "pending": pending, "out_streams": outs}


def kv_used(member: Member) -> int:
    import httpx

    text = httpx.get(member.url + "/metrics", timeout=5).text
    found = re.search(r'^carpool_kv_blocks\{state="used"\} (\S+)', text, re.MULTILINE)
    return int(float(found.group(1))) if found else -1


def wait_busy(member: Member, timeout: float) -> None:
    """Until ``member`` holds KV blocks (a request in flight), for at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while kv_used(member) <= 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def settle(redis_url: str, workers: list[Member], timeout: float = 30.0
           ) -> tuple[dict[str, int], list[int]]:
    deadline = time.monotonic() + timeout
    while True:
        left, kv = leftovers(redis_url), [kv_used(w) for w in workers]
        if (not any(left.values()) and not any(kv)) or time.monotonic() > deadline:
            return left, kv
        time.sleep(0.2)


def run(redis_url: str, model: str, args: argparse.Namespace, folder: Path) -> Report:
    """The whole scenario on ``redis_url`` (logs under ``folder``)."""
    import httpx

    key = asyncio.run(make_key(redis_url))
    fleet = Fleet(redis_url, model, args.serve_arg, folder, args.gateway_drain,
                  args.worker_drain)
    report = Report()
    try:
        for role, n in (("gateway", 2), ("worker", 3)):
            for _ in range(n):
                fleet.start(role)
        name = httpx.get(fleet.gateways[0].url + "/v1/models", timeout=10, headers={
            "Authorization": f"Bearer {key}"}).json()["data"][0]["id"]
        bodies = [{"model": name, "prompt": p, "max_tokens": args.max_tokens,
                   "temperature": 0, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}} for p in PROMPTS]
        # uninterrupted runs, one at a time: what every stream of each prompt must match
        expected = [_reference(fleet, key, body) for body in bodies]
        load = Load(fleet, key, bodies, expected, args.clients)
        load.start()
        time.sleep(args.before)
        load.phase, rolled = "roll", time.monotonic()
        each = args.each if args.each is not None else 3
        for old in fleet.workers[:each] + fleet.gateways[:each]:
            report.exit_codes.append(fleet.replace(old))
        report.roll_s = time.monotonic() - rolled
        time.sleep(args.after)
        load.stop()
        report.results = load.results
        report.leftovers, report.kv_used = settle(redis_url, fleet.workers)
        logs = [line for log in folder.glob("worker-*.log")
                for line in log.read_text(errors="replace").splitlines()]
        report.handed_off = sum(int(m.group(1)) for line in logs
                                if (m := re.search(r"handing (\d+) request", line)))
        report.resumed = sum("resumed" in line for line in logs)
    finally:
        fleet.stop_all()
    return report


def _reference(fleet: Fleet, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """The text and usage of one uninterrupted greedy run of ``body``."""
    import httpx

    text: list[str] = []
    usage = None
    with httpx.stream("POST", fleet.rotation[0].url + "/v1/completions", json=body,
                      timeout=60, headers={"Authorization": f"Bearer {key}"}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[len("data: "):])
                usage = event.get("usage") or usage
                if event.get("choices") and event["choices"][0].get("text"):
                    text.append(event["choices"][0]["text"])
    return _outcome("".join(text), usage)


def _outcome(text: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    """What two runs of one greedy request must agree on (the cached-token count may not:
    it depends on what the worker's prefix cache held)."""
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {"text": text, "usage": None if usage is None else [usage.get(c) for c in counts]}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(report: Report) -> list[str]:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    lines = [("| phase | requests | errors | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
              "TPOT p99 ms | connects retried |"), "|---|---|---|---|---|---|---|---|"]
    for phase in ("before", "roll"):
        rs = [r for r in report.results if r.phase == phase]
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        tpot = [r.tpot_s for r in rs if r.tpot_s is not None]
        lines.append(f"| {phase} | {len(rs)} | {sum(not r.ok for r in rs)} | "
                     f"{ms(percentile(ttft, 0.5))} | {ms(percentile(ttft, 0.99))} | "
                     f"{ms(percentile(tpot, 0.5))} | {ms(percentile(tpot, 0.99))} | "
                     f"{sum(r.retried_connects for r in rs)} |")
    lines.append(f"roll {report.roll_s:.1f} s; exit codes {report.exit_codes}; streams "
                 f"handed off {report.handed_off}, resumed {report.resumed}; left in Redis "
                 f"{report.leftovers}; KV blocks used per worker {report.kv_used}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="carpool bench rolling", description=__doc__)
    p.add_argument("--model", default=None, help="checkpoint dir (default: bundled SmolLM2)")
    p.add_argument("--clients", type=int, default=4, help="concurrent streams")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--before", type=float, default=15.0, help="seconds of load before the roll")
    p.add_argument("--after", type=float, default=3.0, help="seconds of load after it")
    p.add_argument("--gateway-drain", type=float, default=15.0)
    p.add_argument("--each", type=int, default=None,
                   help="replace only the first N workers and N gateways (default: all)")
    p.add_argument("--worker-drain", type=float, default=2.0,
                   help="short, so that some streams are handed off")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `carpool serve` argument (repeat)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from engine.model_files import resolve_model_dir
    from gateway.bus.embedded import EmbeddedRedis

    args = parse_args(argv)
    model = str(resolve_model_dir(args.model))
    with EmbeddedRedis() as redis, tempfile.TemporaryDirectory() as tmp:
        report = run(redis.url, model, args, Path(tmp))
    print(f"rolling restart: 2 gateways, 3 workers, {args.clients} streams of "
          f"{args.max_tokens} tokens; {cpu_model()}")
    print("\n".join(table(report)))
    bad = report.errors() or any(report.exit_codes) or any(report.leftovers.values()) \
        or any(report.kv_used)
    for error in report.errors()[:10]:
        print("error:", error)
    return 1 if bad else 0
