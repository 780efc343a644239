"""Redis stopped and started again under load, with and without its data (AOF on / off):
no request gets a 500 or a cut connection, every request during the outage gets a 503 with
Retry-After and ``code: backend_unavailable``, the log says once that Redis is unreachable and
once that it is back (no tracebacks), and service resumes without restarting anything. With
AOF the stream in flight finishes with exactly the text of an uninterrupted run (greedy, tiny
real engine); after a data loss the tenants file and the admin key are back, the run-time key
is gone (401), and a key issued then works."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.faults.stack import (
    StreamReader,
    idle_kv_blocks,
    issue_key,
    restartable_stack,
    wait_for,
)
from tests.gateway.faults.table import FaultRow, Load, ledger_check, post
from tests.gateway.harness import make_tenant, redis_sync
from tests.gateway.worker.drainer_hold import drainer_held

pytestmark = pytest.mark.timeout(150)

SMALL = {"prompt": "hello there", "max_tokens": 8, "temperature": 0}
LONG = {"prompt": "Once upon a time", "max_tokens": 300, "temperature": 0,
        "stream_options": {"include_usage": True}}
OUTAGE_S = 1.5


def reference_run(url: str, key: str, body: dict[str, Any]) -> StreamReader:
    reader = StreamReader(url, key, body)
    reader.run()
    assert reader.done and not reader.errors, reader.errors
    return reader


def reference_text(url: str, key: str, body: dict[str, Any]) -> str:
    return "".join(reference_run(url, key, body).text)


def received_tokens(load: Load, *streams: StreamReader) -> int:
    """The completion tokens the load's clients and ``streams`` were told they received."""
    answers = sum(b["usage"]["completion_tokens"] for _, status, b in load.log
                  if status == 200)
    return answers + sum(s.usage["completion_tokens"] for s in streams if s.usage)


def bodies(gw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    model = str(gw.engine.model_name)
    return {**SMALL, "model": model}, {**LONG, "model": model}


def outage(server: Any) -> float:
    """Stop Redis for ``OUTAGE_S`` and start it again; returns when it was started."""
    server.stop()
    time.sleep(OUTAGE_S)
    server.start()
    return time.monotonic()


def log_lines(caplog: pytest.LogCaptureFixture, text: str, logger: str) -> int:
    return sum(1 for r in caplog.records if r.name == logger and text in r.getMessage())


def check_logs(caplog: pytest.LogCaptureFixture) -> None:
    for logger in ("carpool.gateway", "carpool.worker"):
        assert log_lines(caplog, "Redis unreachable", logger) == 1, logger
        assert log_lines(caplog, "Redis reachable again", logger) == 1, logger
    tracebacks = [r.getMessage() for r in caplog.records
                  if r.exc_info and r.name.startswith(("carpool", "uvicorn"))]
    assert not tracebacks


def check_outage_answers(load: Load, row: FaultRow) -> None:
    assert row.server_errors == 0 and row.transport_errors == 0, row
    # (the load's requests may all have waited out the outage in flight: the test's own
    # request checks the answer during it)
    refused = [b for _, status, b in load.log if status == 503]
    assert {b["error"]["code"] for b in refused} <= {"backend_unavailable"}
    assert all(b["error"]["type"] == "server_error" for b in refused)


def test_restart_with_aof_loses_nothing(tmp_path: Path, tiny_model_dir: Path,
                                        caplog: pytest.LogCaptureFixture,
                                        fault_rows: list[FaultRow]) -> None:
    caplog.set_level(logging.INFO)
    row = FaultRow("Redis restart, AOF on (load + 1 stream)")
    with restartable_stack(tmp_path, tiny_model_dir, appendonly=True) as (server, gw):
        small, long = bodies(gw)
        key = issue_key(gw.url)
        assert key is not None
        reference = reference_run(gw.url, key, long)
        expected = "".join(reference.text)
        stream = StreamReader(gw.url, key, long)
        with Load(gw.url, key, row, small) as load:
            stream.start()
            assert stream.first.wait(30)
            time.sleep(0.3)
            server.stop()
            time.sleep(0.5)  # past the auth cache: lookups go to Redis
            r = httpx.post(f"{gw.url}/v1/completions", json=small, timeout=10,
                           headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 503 and r.headers["retry-after"]
            assert r.json()["error"]["code"] == "backend_unavailable"
            time.sleep(OUTAGE_S)
            server.start()
            t0 = time.monotonic()
            row.recovery_s = wait_for(lambda: load.first_ok_after(t0), 30)
            time.sleep(0.5)
        stream.join(60)
        row.kv_blocks_after_idle = idle_kv_blocks(gw)
        ledger = ledger_check(server.url, gw.config.namespace, "acme",
                              "Redis restart, AOF on (load + 1 stream)",
                              received_tokens(load, reference, stream), len(load.log) + 2)
    fault_rows.append(row)
    assert stream.done and not stream.errors, stream.errors
    assert "".join(stream.text) == expected  # the stream in flight lost and repeated nothing
    assert ledger.drift == 0, ledger
    check_outage_answers(load, row)
    assert row.kv_blocks_after_idle == 0
    check_logs(caplog)


def test_restart_without_data_recovers_without_restarts(
        tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture,
        fault_rows: list[FaultRow]) -> None:
    caplog.set_level(logging.INFO)
    row = FaultRow("Redis restart, data lost (load + 1 stream)")
    with restartable_stack(tmp_path, tiny_model_dir, appendonly=False) as (server, gw):
        small, long = bodies(gw)
        old_key = issue_key(gw.url)
        assert old_key is not None
        stream = StreamReader(gw.url, old_key, long)
        with Load(gw.url, old_key, row, small) as load:
            stream.start()
            assert stream.first.wait(30)
            t0 = outage(server)
            # the admin key and the tenants file are back without any restart
            new_key = wait_for(lambda: issue_key(gw.url), 30)
            fresh = FaultRow("fresh key")
            with Load(gw.url, new_key, fresh, small, threads=1) as after:
                row.recovery_s = wait_for(lambda: after.first_ok_after(t0), 30)
                time.sleep(0.5)
        stream.join(60)
        row.kv_blocks_after_idle = idle_kv_blocks(gw)
        assert gw.app.state.data_loss_watch.recoveries == 1
    for r in (after.log):
        row.record(r[1], r[2])
    fault_rows.append(row)
    # the stream in flight ends cleanly (its worker still wrote its output)
    assert stream.done, stream.errors
    check_outage_answers(load, row)
    # the key issued at run time is gone: a clear 401, as the README says
    assert load.log[-1][1] == 401 and load.log[-1][2]["error"]["code"] == "invalid_api_key"
    assert fresh.server_errors == 0 and fresh.completed > 0
    assert row.kv_blocks_after_idle == 0
    check_logs(caplog)


def test_requests_queued_when_the_data_is_lost_are_answered_at_once(
        echo_gateway: Any, redis_url: str) -> None:
    """A namespace's keys deleted under a running gateway (a data loss, without the restart):
    the requests it relays that were still queued get a 503 ``backend_unavailable`` within
    the watch's period instead of waiting to their deadline (60 s here)."""
    ns = echo_gateway.config.namespace
    key = make_tenant(redis_url, ns, "lost")
    body = {"model": "echo", "prompt": "hello", "max_tokens": 4}
    answers: list[tuple[int | None, Any]] = []

    def plain() -> None:
        with httpx.Client(base_url=echo_gateway.url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:
            answers.append(post(client, "/v1/completions", body))

    with drainer_held(echo_gateway):
        waiting = [StreamReader(echo_gateway.url, key, body) for _ in range(2)]
        threads = [*waiting, threading.Thread(target=plain, daemon=True)]
        for t in threads:
            t.start()
        # all admitted and queued (the drainer is held): each has its relay open. A fixed
        # sleep let a crowded machine delete the keys before an admission (a 401, not a 503)
        shutdown = echo_gateway.services.shutdown
        wait_for(lambda: len(shutdown.open_relays()) == len(threads), 20, step=0.02)
        r = redis_sync(redis_url)
        r.delete(*r.keys(f"{ns}:*"))  # the data is gone
        lost = time.monotonic()
        for t in threads:
            t.join(20)
        answered_s = time.monotonic() - lost
    assert answered_s < 20  # not their 60 s deadline
    for reader in waiting:  # a stream: the error event, then [DONE]
        assert reader.done and [e["code"] for e in reader.errors] == ["backend_unavailable"]
    assert answers[0][0] == 503 and answers[0][1]["error"]["code"] == "backend_unavailable"
    assert echo_gateway.app.state.data_loss_watch.recoveries == 1
