"""A frozen Redis (its process SIGSTOPped: connections stay up, nothing answers, as in a
network partition): a request is answered 503 with Retry-After and ``backend_unavailable``
within about the request path's read timeout (``bus/client.py`` ``REQUEST_TIMEOUT_S``), not
left hanging; once Redis runs again (SIGCONT) requests succeed, with no 5xx other than those
503s, no traceback, and the outage said once and its end once."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from gateway.bus.client import REQUEST_TIMEOUT_S
from tests.gateway.faults.stack import issue_key, restartable_stack, wait_for

pytestmark = pytest.mark.timeout(150)

# Generous: a busy machine must not fail it; without the read timeout it hangs for ever.
BOUND_S = 3 * REQUEST_TIMEOUT_S


def count(caplog: pytest.LogCaptureFixture, text: str, logger: str) -> int:
    return sum(1 for r in caplog.records if r.name == logger and text in r.getMessage())


def test_a_frozen_redis_answers_503_in_bounded_time_and_service_resumes(
        tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with restartable_stack(tmp_path, tiny_model_dir, appendonly=False) as (server, gw):
        body = {"model": str(gw.engine.model_name), "prompt": "hello", "max_tokens": 4,
                "temperature": 0}
        key = issue_key(gw.url)
        assert key is not None
        headers = {"Authorization": f"Bearer {key}"}

        def post() -> httpx.Response:
            return httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers,
                              timeout=BOUND_S + 30)

        assert post().status_code == 200
        answers: list[tuple[int, float, httpx.Response]] = []
        os.kill(server.pid, signal.SIGSTOP)
        try:
            time.sleep(0.5)  # past the auth cache: the key lookup goes to Redis
            for _ in range(2):  # the first meets the timeout; the next, the outage's ping
                t0 = time.monotonic()
                r = post()
                answers.append((r.status_code, time.monotonic() - t0, r))
        finally:
            os.kill(server.pid, signal.SIGCONT)
        for status, took, r in answers:
            assert status == 503 and took < BOUND_S, (status, took, r.text)
            assert r.headers["retry-after"]
            assert r.json()["error"]["code"] == "backend_unavailable"
        back = wait_for(lambda: post().status_code == 200, 30)
        assert back
        # every loop that met the freeze has said so once, and once that Redis is back
        wait_for(lambda: count(caplog, "Redis reachable again", "carpool.worker")
                 >= count(caplog, "Redis unreachable", "carpool.worker"), 20)
    assert count(caplog, "Redis unreachable", "carpool.gateway") == 1
    assert count(caplog, "Redis reachable again", "carpool.gateway") == 1
    assert count(caplog, "Redis unreachable", "carpool.worker") <= 1
    assert count(caplog, "Redis reachable again", "carpool.worker") <= 1
    tracebacks = [r.getMessage() for r in caplog.records
                  if r.exc_info and r.name.startswith(("carpool", "uvicorn"))]
    assert not tracebacks
