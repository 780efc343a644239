"""A Redis error in a worker loop is survived: the loop logs, backs off and carries on, so
later requests still complete (real embedded Redis, fake echo engine)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import redis.exceptions

from gateway.bus.backoff import Backoff
from gateway.bus.messages import CancelMsg, encode_payload
from tests.gateway.harness import make_tenant, redis_sync

pytestmark = pytest.mark.timeout(60)
BODY = {"model": "echo", "prompt": "hello there", "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def client(echo_gateway: Any, redis_url: str) -> Any:
    key = make_tenant(redis_url, echo_gateway.config.namespace, "resilience")
    with httpx.Client(base_url=echo_gateway.url, timeout=8,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        yield c


def fail_first_call(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str) -> list[int]:
    """Make ``obj.name`` raise a ConnectionError on its first call only; returns the call log."""
    real, calls = getattr(obj, name), []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise redis.exceptions.ConnectionError("injected: connection reset")
        return await real(*args, **kwargs)

    monkeypatch.setattr(obj, name, flaky)
    return calls


def complete(client: httpx.Client) -> str:
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    return str(r.json()["choices"][0]["text"])


def test_writer_survives_a_failed_write(echo_gateway: Any, client: httpx.Client,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    expected = complete(client)
    writer = echo_gateway.services.worker.writer
    # every step through the writer's task (as when the lean connection is down): a step
    # written straight from ``submit`` would never reach ``_write``, whose first call fails
    monkeypatch.setattr(writer, "_write_now", lambda fresh: None)
    calls = fail_first_call(monkeypatch, writer, "_write")
    # the failed batch is written again: the same full text, nothing lost
    assert complete(client) == expected
    assert complete(client) == expected
    assert len(calls) >= 2


def test_drainer_survives_a_failed_pull(echo_gateway: Any, client: httpx.Client,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    expected = complete(client)
    drainer = echo_gateway.services.worker.drainer
    calls = fail_first_call(monkeypatch, drainer, "_pull")
    assert complete(client) == expected
    assert complete(client) == expected
    assert len(calls) >= 2


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    b = Backoff(first_s=0.05, max_s=0.3)
    assert [b.next_delay() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    b.reset()
    assert b.next_delay() == 0.05


def test_cancel_listener_survives_a_failure(echo_gateway: Any, client: httpx.Client,
                                            redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = echo_gateway.services.worker
    real, calls = worker._cancel, []

    def flaky(msg: CancelMsg) -> None:
        calls.append(msg.request_id)
        if len(calls) == 1:
            raise redis.exceptions.ConnectionError("injected: connection reset")
        real(msg)

    monkeypatch.setattr(worker, "_cancel", flaky)
    r = redis_sync(redis_url)
    try:
        r.publish(worker.keys.cancel_channel, encode_payload(CancelMsg("nobody", True, "test")))
    finally:
        r.close()
    deadline = time.monotonic() + 5
    while not calls:
        assert time.monotonic() < deadline, "the cancel listener never got the message"
        time.sleep(0.01)
    # a client that leaves mid-stream is still cancelled: ~1800 echo steps would take seconds
    body = {"model": "echo", "prompt": "x", "max_tokens": 1800, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break
    deadline = time.monotonic() + 1.5
    while echo_gateway.engine.load().num_running:
        assert time.monotonic() < deadline, "the engine kept generating after the disconnect"
        time.sleep(0.01)
    assert len(calls) == 2
