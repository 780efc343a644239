"""Server-side deadline: a request still running when its total time is up is cancelled end to
end; the client gets a 504 (or an SSE error event), the engine drops it, nothing is left."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.cancel_helpers import stat, wait_clean
from tests.gateway.harness import make_config, make_tenant, run_gateway

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def slow_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=20.0,
                         request_timeout_s=1.0)
    with run_gateway(config, redis_url) as gw:
        yield gw


def test_deadline_non_streaming_504(slow_gateway: Any, redis_url: str) -> None:
    ns = slow_gateway.config.namespace
    key = make_tenant(redis_url, ns, "late", max_concurrency=1)
    started = time.monotonic()
    r = httpx.post(slow_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "echo", "prompt": "x", "max_tokens": 500}, timeout=30)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert 0.9 < time.monotonic() - started < 5
    wait_clean(redis_url, ns)
    deadline = time.monotonic() + 5
    while slow_gateway.engine.load().num_running:
        assert time.monotonic() < deadline, "the engine still runs the timed-out request"
        time.sleep(0.05)
    assert stat(redis_url, ns, "aborted") >= 1
    # the concurrency slot (max 1) was released: the next request is admitted
    r = httpx.post(slow_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "echo", "prompt": "x", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200


def test_deadline_streaming_error_event(slow_gateway: Any, redis_url: str) -> None:
    ns = slow_gateway.config.namespace
    key = make_tenant(redis_url, ns, "late-stream")
    r = httpx.post(slow_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "echo", "prompt": "x", "max_tokens": 500, "stream": True},
                   timeout=30)
    events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "timeout" and "deadline" in err["message"]
    assert 10 < len(events) < 100  # some tokens streamed before the deadline
    wait_clean(redis_url, ns)


@pytest.fixture(scope="module")
def stall_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=5.0,
                         stall_timeout_s=1.0)
    with run_gateway(config, redis_url) as gw:
        yield gw


async def _never_reading_client(app: Any, key: str, body: bytes) -> list[str]:
    """Drive the real ASGI app (middleware, endpoint, admission, worker, engine) with a client
    that sends its request and then never takes a byte of the response: every body ``send``
    blocks, as it does in uvicorn once the socket buffers are full."""
    sent: list[str] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # connected, silent
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"authorization", b"Bearer " + key.encode()),
                         (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return sent


def test_client_that_stops_reading_is_cancelled(stall_gateway: Any, redis_url: str) -> None:
    ns = stall_gateway.config.namespace
    key = make_tenant(redis_url, ns, "sleepy", max_concurrency=1)
    aborted_before = stat(redis_url, ns, "aborted")
    body = json.dumps({"model": "echo", "prompt": "a b c d", "max_tokens": 1000,
                       "stream": True}).encode()
    started = time.monotonic()
    sent = stall_gateway.call(_never_reading_client(stall_gateway.app, key, body), timeout=30)
    assert sent[0] == "http.response.start"
    assert 1.0 <= time.monotonic() - started < 10  # the stall timeout, not the 1000 tokens
    wait_clean(redis_url, ns)
    deadline = time.monotonic() + 5
    while stat(redis_url, ns, "aborted") == aborted_before or \
            stall_gateway.engine.load().num_running:
        assert time.monotonic() < deadline, "the stalled request was not aborted"
        time.sleep(0.05)
