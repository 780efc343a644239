"""A relay that fails with an unexpected error cancels its request end to end: the engine
stops generating, the output stream is deleted and the abort is counted (echo engine). So
does one whose output has a gap (a write lost in a Redis failover): its client gets a clear
``output_lost`` error instead of a text with a hole; and one whose admission a failover
lost is answered at once, not at its deadline."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from gateway.bus.messages import TokenMsg
from gateway.http import relay
from gateway.http.relay import RelayResponse
from tests.gateway.cancel_helpers import stat, wait_clean
from tests.gateway.faults.stack import StreamReader, wait_for
from tests.gateway.harness import make_tenant, redis_sync
from tests.gateway.worker.drainer_hold import drainer_held

pytestmark = pytest.mark.timeout(60)


def test_relay_error_cancels_the_request(echo_gateway: Any, redis_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ns = echo_gateway.config.namespace
    key = make_tenant(redis_url, ns, "relay-failure")
    aborted_before = stat(redis_url, ns, "aborted")

    def boom(self: RelayResponse, msg: Any) -> None:
        raise RuntimeError("injected relay failure")

    monkeypatch.setattr(RelayResponse, "_on_tokens", boom)
    # ~1800 echo steps of 2 ms: generation would run for seconds if nobody cancelled it
    body = {"model": "echo", "prompt": "x", "max_tokens": 1800}
    with httpx.Client(base_url=echo_gateway.url, timeout=10,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 500
    deadline = time.monotonic() + 1.0
    while echo_gateway.engine.load().num_running:
        assert time.monotonic() < deadline, "the engine kept generating for a failed relay"
        time.sleep(0.01)
    wait_clean(redis_url, ns, timeout=3)
    assert stat(redis_url, ns, "aborted") == aborted_before + 1


def _losing_a_write(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """Each relay loses its request's ``nth`` token message before it reads it, as a write
    that a failed-over Redis master acknowledged but never replicated."""
    fresh = RelayResponse._fresh
    seen: dict[int, int] = {}

    def lossy(self: RelayResponse, batch: list[Any]) -> list[Any]:
        kept = []
        for msg in batch:
            if isinstance(msg, TokenMsg):
                seen[id(self)] = seen.get(id(self), 0) + 1
                if seen[id(self)] == nth:
                    continue
            kept.append(msg)
        return fresh(self, kept)

    monkeypatch.setattr(RelayResponse, "_fresh", lossy)


@pytest.mark.parametrize("stream", [True, False])
def test_a_gap_in_the_output_ends_with_a_clear_error(
        echo_gateway: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        stream: bool) -> None:
    ns = echo_gateway.config.namespace
    key = make_tenant(redis_url, ns, f"relay-gap-{stream}")
    # a non-streamed answer is two writes: its first tokens, then the rest with the finish
    _losing_a_write(monkeypatch, 2 if stream else 1)
    body = {"model": "echo", "prompt": "one two three", "max_tokens": 1800, "stream": stream}
    with httpx.Client(base_url=echo_gateway.url, timeout=10,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        if stream:
            with c.stream("POST", "/v1/completions", json=body) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            assert r.status_code == 200 and events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
        else:
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            error = r.json()["error"]
    assert error["code"] == "output_lost" and error["type"] == "server_error"
    deadline = time.monotonic() + 1.0
    while echo_gateway.engine.load().num_running:
        assert time.monotonic() < deadline, "the engine kept generating for a lost output"
        time.sleep(0.01)
    wait_clean(redis_url, ns, timeout=3)


def _queued_requests(redis_url: str, ns: str, tenant: str) -> list[bytes]:
    """The record keys of ``tenant``'s requests still queued."""
    r = redis_sync(redis_url)
    try:
        return [k for k in r.scan_iter(f"{ns}:*:req:*")
                if r.hget(k, "tenant") == tenant.encode()
                and r.hget(k, "state") == b"queued"]
    finally:
        r.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_whose_admission_was_lost_is_answered_at_once(
        echo_gateway: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        stream: bool) -> None:
    """Its record gone while it waits (a failover lost the admission): a 503 (or the error
    event of a started stream) within the check's period, not at its 60 s deadline."""
    ns = echo_gateway.config.namespace
    tenant = f"relay-lost-{stream}"
    key = make_tenant(redis_url, ns, tenant)
    monkeypatch.setattr(relay, "LOST_CHECK_S", 0.2)
    body = {"model": "echo", "prompt": "one two three", "max_tokens": 4, "stream": stream}
    with drainer_held(echo_gateway):
        reader = StreamReader(echo_gateway.url, key, body) if stream else None
        answers: list[Any] = []

        def plain() -> None:
            answers.append(httpx.post(f"{echo_gateway.url}/v1/completions", json=body,
                                      timeout=30, headers={"Authorization": f"Bearer {key}"}))

        client = reader or threading.Thread(target=plain, daemon=True)
        client.start()
        found = wait_for(lambda: _queued_requests(redis_url, ns, tenant), 10, step=0.02)
        redis_sync(redis_url).delete(*found)  # the admission is gone
        lost = time.monotonic()
        client.join(20)
        answered_s = time.monotonic() - lost
    assert answered_s < 5
    if reader is not None:
        assert reader.done and [e["code"] for e in reader.errors] == ["backend_unavailable"]
    else:
        r = answers[0]
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "backend_unavailable"
