"""Request migration: a gateway and two worker processes (tiny real engine) on one Redis
(``real_cluster``, shared with the drain tests; a killed worker is replaced for the next);
greedy streams are frozen mid-generation (SIGSTOP on both workers), the worker holding
some of them is SIGKILLed and the other resumes. Each client's stream just continues: its
text equals an uninterrupted run's, its usage counts every token once, and the surviving
worker says it resumed them. The same holds for a stream constrained by a JSON Schema: its
grammar state is rebuilt on the other worker from the delivered tokens, and the reassembled
output still validates. A request that no worker can take ends, within its deadline, with a
clear error."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from gateway.bus.keys import RedisKeys
from tests.gateway.faults.cluster import ENGINE, Cluster
from tests.gateway.faults.stack import StreamReader
from tests.gateway.faults.table import FaultRow, ledger_check
from tests.gateway.harness import make_tenant, redis_sync
from tests.gateway.procs import Proc, spawn_all

pytestmark = pytest.mark.timeout(240)
PROMPTS = ["Once upon a time", "The capital of France", "def main():", "In 1905, Einstein"]
MAX_TOKENS = 600
# long (120 items, some 400 tokens) yet bounded: the grammar closes it well within max_tokens
SCHEMA = {"type": "object", "properties": {
    "notes": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma", "delta"]},
              "minItems": 120, "maxItems": 120},
    "n": {"type": "integer", "minimum": 0, "maximum": 9999}},
    "required": ["notes", "n"], "additionalProperties": False}


def body(model: str, prompt: str) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True}}


def kv_used(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(r'^carpool_kv_blocks\{state="used"\} (\S+)', text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def idle_kv_used(port: int, timeout: float = 20.0) -> int:
    """The worker's used KV blocks once they reached 0 (or what is left after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while (used := kv_used(port)) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return int(used)


def owner(redis_url: str, ns: str, request_id: str, tenant: str) -> str:
    """The worker holding ``tenant``'s request (its record is in the tenant's shard)."""
    raw = redis_sync(redis_url).hget(RedisKeys(ns).req(request_id, tenant), "worker")
    return raw.decode() if raw else ""


def kill_the_busier(redis_url: str, ns: str, workers: list[tuple[Proc, int]],
                    streams: list[StreamReader], tenant: str
                    ) -> tuple[tuple[Proc, int], int, float]:
    """Freeze both workers mid-stream, SIGKILL the one owning more of ``streams`` (``tenant``'s)
    and let the other go on: (the survivor, the streams in flight on the victim, when)."""
    for proc, _ in workers:  # freeze generation mid-stream
        os.kill(proc.popen.pid, signal.SIGSTOP)
    owners = [owner(redis_url, ns, s.request_id or "", tenant) for s in streams]
    victim, survivor = sorted(workers, key=lambda w: -sum(
        str(w[0].popen.pid) in o and not s.done for o, s in zip(owners, streams)))
    moved = sum(str(victim[0].popen.pid) in o and not s.done for o, s in zip(owners, streams))
    os.kill(victim[0].popen.pid, signal.SIGKILL)
    killed = time.monotonic()
    os.kill(survivor[0].popen.pid, signal.SIGCONT)
    return survivor, moved, killed


def run_and_kill(redis_url: str, ns: str, workers: list[tuple[Proc, int]],
                 streams: list[StreamReader], tenant: str, label: Callable[[int], str]
                 ) -> tuple[tuple[Proc, int], int, FaultRow]:
    """Start ``streams`` (``tenant``'s), SIGKILL the busier worker once each has its first token, and wait
    for them: (the survivor, the streams moved, the fault-table row, named by ``label``)."""
    for s in streams:
        s.start()
    assert all(s.first.wait(60) for s in streams)
    survivor, moved, killed = kill_the_busier(redis_url, ns, workers, streams, tenant)
    for s in streams:
        s.join(120)
    row = FaultRow(label(moved))
    for s in streams:
        row.record(200 if s.done and not s.errors else 503, {"error": {"code": "stream"}})
    row.recovery_s = time.monotonic() - killed  # until the last stream ended
    row.kv_blocks_after_idle = idle_kv_used(survivor[1])
    return survivor, moved, row


def resumed(proc: Proc, since: dict[int, int]) -> int:
    """How many streams ``proc`` said it resumed after ``since`` (pid -> lines then)."""
    return sum("resumed" in line for line in proc.lines[since[proc.popen.pid]:])


def test_streams_of_a_killed_worker_resume_on_the_other(
        real_cluster: Cluster, redis_url: str, fault_rows: list[FaultRow]) -> None:
    ns, gw, workers = real_cluster.ns, real_cluster.gateway, real_cluster.workers()
    since = {proc.popen.pid: len(proc.lines) for proc, _ in workers}
    key = make_tenant(redis_url, ns, "mig")
    model = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                      timeout=10).json()["data"][0]["id"]
    refs = [StreamReader(gw.url, key, body(model, p)) for p in PROMPTS]
    for ref in refs:  # uninterrupted runs, side by side (greedy: each as it would run alone)
        ref.start()
    for ref in refs:
        ref.join(120)
        assert ref.done and not ref.errors, ref.errors
    expected = [("".join(ref.text), ref.usage) for ref in refs]
    streams = [StreamReader(gw.url, key, body(model, p)) for p in PROMPTS]
    survivor, moved, row = run_and_kill(
        redis_url, ns, workers, streams, "mig",
        lambda moved: f"worker SIGKILL mid-stream (2 workers, {len(streams)} greedy streams, "
                      f"{moved} moved)")
    fault_rows.append(row)
    received = sum(s.usage["completion_tokens"] for s in refs + streams if s.usage)
    ledger = ledger_check(redis_url, ns, "mig", f"worker SIGKILL mid-stream ({moved} of "
                          f"{len(streams)} streams moved)", received, len(refs + streams))
    assert ledger.drift == 0, ledger
    assert moved > 0, "no stream was in flight on the killed worker"
    for s, (text, usage) in zip(streams, expected):
        assert s.done and not s.errors, s.errors
        assert "".join(s.text) == text  # nothing missing, nothing repeated
        assert s.usage is not None and usage is not None
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")
        assert [s.usage[c] for c in counts] == [usage[c] for c in counts]  # each token once
    assert resumed(survivor[0], since) == moved


def test_a_constrained_stream_of_a_killed_worker_resumes_and_still_validates(
        real_cluster: Cluster, redis_url: str, fault_rows: list[FaultRow]) -> None:
    ns, gw, workers = real_cluster.ns, real_cluster.gateway, real_cluster.workers()
    since = {proc.popen.pid: len(proc.lines) for proc, _ in workers}
    key = make_tenant(redis_url, ns, "mig-json")
    model = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                      timeout=10).json()["data"][0]["id"]
    fmt = {"type": "json_schema", "json_schema": {"name": "notes", "schema": SCHEMA,
                                                  "strict": True}}
    req = {"model": model, "prompt": "Notes as JSON:", "max_tokens": 900, "temperature": 0,
           "response_format": fmt, "stream_options": {"include_usage": True}}
    ref = StreamReader(gw.url, key, req)  # uninterrupted (greedy: the same tokens again)
    ref.start()
    ref.join(120)
    assert ref.done and not ref.errors, ref.errors
    text, usage = "".join(ref.text), ref.usage
    jsonschema.validate(json.loads(text), SCHEMA)
    # a second stream on each worker: whichever is killed holds a constrained one
    streams = [StreamReader(gw.url, key, req) for _ in workers]
    survivor, moved, row = run_and_kill(
        redis_url, ns, workers, streams, "mig-json",
        lambda moved: f"worker SIGKILL mid-stream, json_schema streams ({moved} of "
                      f"{len(streams)} moved)")
    fault_rows.append(row)
    received = sum(s.usage["completion_tokens"] for s in [ref, *streams] if s.usage)
    ledger = ledger_check(redis_url, ns, "mig-json", f"worker SIGKILL mid-stream, json_schema "
                          f"({moved} of {len(streams)} moved)", received, 1 + len(streams))
    assert ledger.drift == 0, ledger
    assert moved > 0, "no constrained stream was in flight on the killed worker"
    for s in streams:
        assert s.done and not s.errors, s.errors
        assert "".join(s.text) == text  # nothing lost, nothing repeated
        jsonschema.validate(json.loads("".join(s.text)), SCHEMA)
        assert s.usage is not None and usage is not None
        assert s.usage["completion_tokens"] == usage["completion_tokens"]  # each token once
    assert resumed(survivor[0], since) == moved
    assert row.kv_blocks_after_idle == 0


def test_with_no_worker_left_the_stream_ends_with_a_clear_error_at_its_deadline(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path,
        fault_rows: list[FaultRow]) -> None:
    ns = f"mig0{os.getpid()}{time.monotonic_ns() % 100000}"
    env = {"CARPOOL_REQUEST_TIMEOUT_S": "6"}
    with spawn_all(redis_url, ns, tiny_model_dir, tmp_path, ("gateway", ENGINE),
                   ("worker", ENGINE), env=env) as (gw, w):
        key = make_tenant(redis_url, ns, "mig")
        model = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                          timeout=10).json()["data"][0]["id"]
        stream = StreamReader(gw.url, key, body(model, PROMPTS[0]))
        stream.start()
        assert stream.first.wait(60)
        os.kill(w.popen.pid, signal.SIGKILL)
        killed = time.monotonic()
        stream.join(30)
        ended = time.monotonic() - killed
    assert stream.done and [e["code"] for e in stream.errors] == ["timeout"]
    fault_rows.append(FaultRow("worker SIGKILL, no worker left (deadline 6 s)", requests=1,
                               clear_errors=1, recovery_s=ended, codes={"timeout": 1}))
