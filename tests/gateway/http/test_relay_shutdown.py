"""The relays at a server's stop (``gateway/http/shutdown.py``), in a real gateway with the echo
engine: ``end_inflight`` ends a stream with the shutdown error event and ``[DONE]`` and a
non-streaming request with a 503 + Retry-After, and cancels both end to end (engine idle,
nothing left in Redis, both counted aborted); once shutdown has begun, new requests get a 503
+ Retry-After while ``/healthz`` still answers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.http.errors import SHUTDOWN_RETRY_AFTER_S
from tests.gateway.cancel_helpers import stat, wait_clean, wait_engine_idle
from tests.gateway.harness import make_config, make_tenant, run_gateway

pytestmark = pytest.mark.timeout(60)

# 20 ms a step: 1000 tokens run for 20 s unless something ends them
BODY = {"model": "echo", "prompt": "hello there", "max_tokens": 1000}


@pytest.fixture
def gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """A gateway of its own: a shutdown once begun is not undone."""
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=20.0)
    with run_gateway(config, redis_url) as gw:
        yield gw


def _on_loop(gw: Any, fn: Any) -> None:
    """Call ``fn`` on the server's loop and wait until it has run."""

    async def call() -> None:
        fn()

    gw.call(call(), timeout=5)


def _wait_running(gw: Any, n: int) -> None:
    deadline = time.monotonic() + 10
    while gw.engine.load().num_running < n:
        assert time.monotonic() < deadline, "requests did not start"
        time.sleep(0.01)


def _wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_end_inflight_ends_streams_and_answers_the_rest(gateway: Any, redis_url: str) -> None:
    ns = gateway.config.namespace
    key = make_tenant(redis_url, ns, "shut")
    aborted_before = stat(redis_url, ns, "aborted")
    client = httpx.Client(base_url=gateway.url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})
    events: list[str] = []
    answers: dict[str, httpx.Response] = {}

    def stream() -> None:
        with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():  # one by one: the test polls for the first
                if line:
                    events.append(line)

    def full() -> None:
        answers["full"] = client.post("/v1/completions", json=BODY)

    threads = [threading.Thread(target=stream), threading.Thread(target=full)]
    for t in threads:
        t.start()
    _wait_running(gateway, 2)
    _wait_until(lambda: len(events) > 0)  # some tokens streamed
    _on_loop(gateway, gateway.services.shutdown.end_inflight)
    for t in threads:
        t.join(10)
    client.close()
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "server_shutdown"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)
    resp = answers["full"]
    assert resp.status_code == 503, resp.text
    assert resp.headers["retry-after"] == str(SHUTDOWN_RETRY_AFTER_S)
    assert resp.json()["error"]["code"] == "server_shutdown"
    # cancelled end to end: aborted in the engine, leases and output streams gone
    wait_engine_idle(gateway, timeout=5)
    wait_clean(redis_url, ns, timeout=5)
    assert stat(redis_url, ns, "aborted") == aborted_before + 2
    assert gateway.services.shutdown.end_inflight() == 0  # none left open


def test_requests_after_shutdown_began_get_503(gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, gateway.config.namespace, "late")
    _on_loop(gateway, gateway.services.shutdown.begin)
    with httpx.Client(base_url=gateway.url, timeout=10,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        resp = client.post("/v1/completions", json=BODY)
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"] == str(SHUTDOWN_RETRY_AFTER_S)
        assert resp.json()["error"]["code"] == "server_shutdown"
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200
    assert gateway.engine.load().num_running == 0


def test_a_request_in_flight_can_be_looked_up_and_cancelled_during_the_graceful_period(
        gateway: Any, redis_url: str) -> None:
    """The gate refuses new work only: the status and the cancel of a request already
    admitted still answer, and the cancel ends its stream (and frees its engine seat)."""
    key = make_tenant(redis_url, gateway.config.namespace, "giveup")
    events: list[str] = []
    rid: list[str] = []
    client = httpx.Client(base_url=gateway.url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})

    def stream() -> None:
        with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as resp:
            rid.append(resp.headers["x-request-id"])
            for line in resp.iter_lines():
                if line:
                    events.append(line)

    thread = threading.Thread(target=stream)
    thread.start()
    _wait_until(lambda: len(events) > 0)
    _on_loop(gateway, gateway.services.shutdown.begin)
    try:
        assert client.post("/v1/completions", json=BODY).status_code == 503  # new work: no
        got = client.get(f"/v1/requests/{rid[0]}")
        assert got.status_code == 200, got.text
        assert got.json()["status"] == "running"
        cancel = client.post(f"/v1/requests/{rid[0]}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["status"] == "cancelled"
        thread.join(10)
        assert not thread.is_alive()
        assert events[-1] == "data: [DONE]"
        wait_engine_idle(gateway, timeout=5)
    finally:
        client.close()
