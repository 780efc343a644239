"""A worker stopped in order (SIGTERM, ``Worker.drain``): a gateway and worker processes on
one Redis. It takes no new work at once, lets its streams finish within the drain deadline,
and past the deadline (or at a second SIGTERM) hands what is left to another worker, which
resumes each stream from the tokens its client already has: every token once, in order, the
same text as an uninterrupted run (greedy, tiny real model). It exits 0; nothing is left in
Redis (entries, leases, output streams) and no KV block stays used."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.worker.handoff import HANDOFF_WAIT_S
from tests.gateway.cancel_helpers import leftovers, wait_clean
from tests.gateway.faults.cluster import Cluster
from tests.gateway.faults.stack import StreamReader
from tests.gateway.faults.table import FaultRow
from tests.gateway.faults.test_worker_death import PROMPTS, body, idle_kv_used, owner, resumed
from tests.gateway.harness import make_tenant
from tests.gateway.procs import Proc, spawn, spawn_all

pytestmark = pytest.mark.timeout(240)
ECHO_BODY = {"model": "echo", "prompt": "a b c d e", "stream": True,
             "stream_options": {"include_usage": True}}


def model_of(gw: Proc, key: str) -> str:
    return str(httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=10).json()["data"][0]["id"])


def holder(workers: list[Any], owners: list[str]) -> Any:
    """The worker (``(Proc, ...)`` tuples) holding the most of the requests ``owners`` name."""
    return max(workers, key=lambda w: sum(str(w[0].popen.pid) in o for o in owners))


def test_a_stopped_worker_hands_its_streams_to_the_other_with_every_token_once(
        real_cluster: Cluster, redis_url: str, fault_rows: list[FaultRow]) -> None:
    # the cluster's workers drain with a deadline of 0: the hand-off starts at once, while
    # every stream is mid-generation; no reclaim by idleness: only the hand-off moves them
    ns, gw, workers = real_cluster.ns, real_cluster.gateway, real_cluster.workers()
    since = {proc.popen.pid: len(proc.lines) for proc, _ in workers}
    key = make_tenant(redis_url, ns, "drain")
    model = model_of(gw, key)
    refs = [StreamReader(gw.url, key, body(model, p)) for p in PROMPTS]
    for ref in refs:
        ref.start()
    for ref in refs:
        ref.join(120)
        assert ref.done and not ref.errors, ref.errors
    streams = [StreamReader(gw.url, key, body(model, p)) for p in PROMPTS]
    for s in streams:
        s.start()
    assert all(s.first.wait(60) for s in streams)
    owners = [owner(redis_url, ns, s.request_id or "", "drain") for s in streams]
    victim = holder(workers, owners)
    survivor = next(w for w in workers if w is not victim)
    victim[0].popen.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert victim[0].popen.wait(30) == 0, "".join(victim[0].lines[-30:])
    exited = time.monotonic() - stopped
    for s in streams:
        s.join(120)
    row = FaultRow(f"worker SIGTERM mid-stream, drain 0 s (2 workers, {len(streams)} "
                   "greedy streams)")
    for s in streams:
        row.record(200 if s.done and not s.errors else 503, {"error": {"code": "stream"}})
    row.recovery_s = time.monotonic() - stopped
    row.kv_blocks_after_idle = idle_kv_used(survivor[1])
    fault_rows.append(row)
    wait_clean(redis_url, ns, timeout=10)
    victim_log = "".join(victim[0].lines)
    assert "handing" in victim_log and "Traceback" not in victim_log, victim_log[-3000:]
    for s, ref in zip(streams, refs, strict=True):
        assert s.done and not s.errors, s.errors
        assert "".join(s.text) == "".join(ref.text)  # nothing missing, repeated or reordered
        assert s.usage is not None and ref.usage is not None
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")
        assert [s.usage[c] for c in counts] == [ref.usage[c] for c in counts]
    assert resumed(survivor[0], since) >= 1
    assert row.kv_blocks_after_idle == 0
    assert exited < 15


def test_a_draining_worker_finishes_its_streams_and_takes_no_new_work(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    ns = f"dr{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "drain")
    headers = {"Authorization": f"Bearer {key}"}
    with spawn_all(redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []),
                   ("worker", ["--echo-step-ms", "20"])) as (gw, wa):
        first = StreamReader(gw.url, key, {**ECHO_BODY, "max_tokens": 100})  # ~2 s
        first.start()
        assert first.first.wait(30)
        wa.popen.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        wa.wait_for(lambda: any("draining" in ln for ln in wa.lines), timeout=10)
        later = StreamReader(gw.url, key, {**ECHO_BODY, "max_tokens": 20})
        later.start()
        assert wa.popen.wait(30) == 0
        exited = time.monotonic() - stopped
        first.join(10)
        assert first.done and not first.errors, first.errors
        assert first.usage is not None and first.usage["completion_tokens"] == 100
        time.sleep(0.5)
        assert not later.done  # queued: no worker took it
        assert sum(leftovers(redis_url, ns)["queued"].values()) == 1
        with spawn("worker", redis_url, ns, tiny_model_dir, tmp_path) as wb:
            later.join(30)
            assert later.done and not later.errors, later.errors
            assert str(wb.popen.pid) in owner(redis_url, ns, later.request_id or "", "drain")
        wait_clean(redis_url, ns, timeout=10)
        assert httpx.get(gw.url + "/readyz", headers=headers, timeout=5).status_code == 200
    log = "".join(wa.lines)
    assert "handing" not in log and "Traceback" not in log, log
    assert exited < 10  # it left once its stream had finished, not at the 30 s deadline


@pytest.mark.parametrize("how", ["deadline", "second SIGTERM"])
def test_the_deadline_or_a_second_sigterm_hands_off_what_is_left(
        how: str, redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    ns = f"dr{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "drain")
    drain = ["--drain-timeout", "1" if how == "deadline" else "60"]
    echo = ["--echo-step-ms", "20", *drain]
    with spawn_all(redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []), ("worker", echo),
                   ("worker", echo)) as (gw, wa, wb):
        stream = StreamReader(gw.url, key, {**ECHO_BODY, "max_tokens": 400})  # ~8 s
        stream.start()
        assert stream.first.wait(30)
        victim = holder([(wa,), (wb,)], [owner(redis_url, ns, stream.request_id or "", "drain")])[0]
        survivor = wb if victim is wa else wa
        victim.popen.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        if how == "second SIGTERM":
            victim.wait_for(lambda: any("draining" in ln for ln in victim.lines), timeout=10)
            victim.popen.send_signal(signal.SIGTERM)
        assert victim.popen.wait(30) == 0
        exited = time.monotonic() - stopped
        stream.join(30)
        wait_clean(redis_url, ns, timeout=10)
    assert stream.done and not stream.errors, stream.errors
    assert stream.usage is not None and stream.usage["completion_tokens"] == 400
    assert "handing 1 request" in "".join(victim.lines)
    assert any("resumed" in ln for ln in survivor.lines)
    assert exited < 6  # long before the stream would have ended on its own


def test_with_no_other_worker_the_stream_ends_with_a_clear_error_after_the_deadline(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    ns = f"dr{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "drain")
    with spawn_all(redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []),
                   ("worker", ["--echo-step-ms", "20", "--drain-timeout", "2"])) as (gw, wa):
        stream = StreamReader(gw.url, key, {**ECHO_BODY, "max_tokens": 1000})  # ~20 s
        stream.start()
        assert stream.first.wait(30)
        wa.popen.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        stream.join(15)
        ended = time.monotonic() - stopped
        assert wa.popen.wait(10) == 0
        wait_clean(redis_url, ns, timeout=10)
    assert stream.done and len(stream.errors) == 1, stream.errors
    error = stream.errors[0]
    assert error["code"] == "worker_lost" and "no other worker" in error["message"], error
    # after the deadline and the look for a worker to hand it to (HANDOFF_WAIT_S), long
    # before the request's own deadline
    assert 2 + HANDOFF_WAIT_S <= ended < 15
