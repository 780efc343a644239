"""Cancellation end to end (real engine, tiny model): client disconnect while streaming and
while waiting for a non-streaming answer, explicit cancel by the owner (and nobody else),
cancel while still queued. Each ends with the KV blocks free, nothing left in Redis, the
reservation refunded and the abort counted."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

from gateway.bus.keys import RedisKeys
from tests.gateway.cancel_helpers import leftovers, stat, wait_clean, wait_engine_idle
from tests.gateway.harness import make_tenant, redis_sync
from tests.gateway.worker.drainer_hold import start_drainer, stop_drainer

pytestmark = pytest.mark.timeout(90)
TPM = 100_000


@pytest.fixture(scope="module")
def keys(tiny_gateway: Any, redis_url: str) -> dict[str, str]:
    ns = tiny_gateway.config.namespace
    return {"a": make_tenant(redis_url, ns, "tenant-a", tpm=TPM, max_concurrency=8),
            "b": make_tenant(redis_url, ns, "tenant-b")}


@pytest.fixture(scope="module")
def model(tiny_gateway: Any) -> str:
    return str(tiny_gateway.engine.model_name)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tpm_level(redis_url: str, ns: str, tenant: str) -> float:
    r = redis_sync(redis_url)
    try:
        level = r.hget(RedisKeys(ns).bucket(tenant, "tpm"), "level")
        return float(level) if level is not None else float(TPM)
    finally:
        r.close()


def long_request(model: str, stream: bool) -> dict[str, Any]:
    # ignore the random model's EOS by asking for many tokens; 480 + 8 fits the 512 context
    return {"model": model, "prompt": [5, 6, 7, 8, 9, 10, 11, 12], "max_tokens": 480,
            "temperature": 0, "stream": stream}


def test_stream_disconnect_frees_everything(tiny_gateway: Any, keys: dict[str, str],
                                            model: str, redis_url: str) -> None:
    ns = tiny_gateway.config.namespace
    aborted_before = stat(redis_url, ns, "aborted")
    with (
        httpx.Client(base_url=tiny_gateway.url, headers=auth(keys["a"]), timeout=30) as c,
        c.stream("POST", "/v1/completions", json=long_request(model, True)) as r,
    ):
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 3:
                break  # leaving the block closes the connection mid-stream
    assert tiny_gateway.engine.load().num_running <= 1
    wait_engine_idle(tiny_gateway)
    wait_clean(redis_url, ns)
    assert stat(redis_url, ns, "aborted") == aborted_before + 1
    # the 488-token reservation came back except what was used (8 prompt + a few tokens)
    assert tpm_level(redis_url, ns, "tenant-a") > TPM - 100


def _post_then_hang_up(gw: Any, key: str, body: dict[str, Any]) -> None:
    """Send a non-streaming request on a raw socket and close it as soon as the engine runs
    the request (its step count moves): a read timeout would leave it to the machine's speed
    whether the tiny model finishes first (480 steps took under 0.4 s on a fast CPU)."""
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    steps_before = gw.engine.engine.step_count
    with socket.create_connection(("127.0.0.1", gw.config.port), timeout=30) as sock:
        sock.sendall(head + payload)
        deadline = time.monotonic() + 30
        while gw.engine.engine.step_count == steps_before:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.001)


def test_non_streaming_disconnect_aborts(tiny_gateway: Any, keys: dict[str, str], model: str,
                                         redis_url: str) -> None:
    ns = tiny_gateway.config.namespace
    aborted_before = stat(redis_url, ns, "aborted")
    steps_before = tiny_gateway.engine.engine.step_count
    _post_then_hang_up(tiny_gateway, keys["a"], long_request(model, False))
    wait_engine_idle(tiny_gateway)
    steps = tiny_gateway.engine.engine.step_count - steps_before
    assert steps < 470, "the request ran to completion instead of being aborted"
    wait_clean(redis_url, ns)
    assert stat(redis_url, ns, "aborted") == aborted_before + 1


def _first_event(lines: Any) -> dict[str, Any]:
    for line in lines:
        if line.startswith("data: "):
            return json.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("no event")


def test_explicit_cancel_owner_only(tiny_gateway: Any, keys: dict[str, str], model: str,
                                    redis_url: str) -> None:
    url, ns = tiny_gateway.url, tiny_gateway.config.namespace
    with (
        httpx.Client(base_url=url, timeout=30) as c,
        c.stream("POST", "/v1/completions", json=long_request(model, True),
                 headers=auth(keys["a"])) as r,
    ):
        lines = r.iter_lines()
        rid = _first_event(lines)["id"]
        # BOLA: tenant B can neither read nor cancel A's request, and learns nothing
        for method, path in (("GET", f"/v1/requests/{rid}"),
                             ("POST", f"/v1/requests/{rid}/cancel")):
            other = c.request(method, path, headers=auth(keys["b"]))
            missing = c.request(method, path.replace(rid, "cmpl-" + "0" * 32),
                                headers=auth(keys["b"]))
            assert other.status_code == 404 and missing.status_code == 404
            assert other.json()["error"]["message"].replace(rid, "X") == \
                missing.json()["error"]["message"].replace("cmpl-" + "0" * 32, "X")
        assert c.get(f"/v1/requests/{rid}", headers=auth(keys["a"])).json()["status"] \
            == "running"
        done = c.post(f"/v1/requests/{rid}/cancel", headers=auth(keys["a"]))
        assert done.status_code == 200 and done.json()["status"] == "cancelled"
        rest = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "abort"
    wait_engine_idle(tiny_gateway)
    wait_clean(redis_url, ns)
    again = httpx.post(f"{url}/v1/requests/{rid}/cancel", headers=auth(keys["a"]))
    assert again.json()["status"] == "already_finished"


def test_cancel_while_queued(tiny_gateway: Any, keys: dict[str, str], model: str,
                             redis_url: str) -> None:
    """Held in the queue (drainer paused): an explicit cancel answers the live reader, a
    disconnect removes the entry; neither ever reaches the engine."""
    ns = tiny_gateway.config.namespace
    started_before = tiny_gateway.engine.engine.step_count
    stop_drainer(tiny_gateway)  # waits out an in-flight blocking read (200 ms)
    try:
        with httpx.Client(base_url=tiny_gateway.url, headers=auth(keys["a"]), timeout=30) as c:
            with c.stream("POST", "/v1/completions", json=long_request(model, True)) as r:
                lines = r.iter_lines()
                rid = r.headers["x-request-id"]  # headers go out at once, before any token
                assert leftovers(redis_url, ns)["queued"] == {"interactive": 1}
                assert c.get(f"/v1/requests/{rid}").json()["status"] == "queued"
                assert c.post(f"/v1/requests/{rid}/cancel").json()["status"] == "cancelled"
                rest = [ln[6:] for ln in lines if ln.startswith("data: ")]
            assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "abort"
            # the reader-gone variant: disconnect while queued
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/completions", json=long_request(model, False),
                       timeout=httpx.Timeout(30, read=0.3))
            wait_clean(redis_url, ns)
    finally:
        start_drainer(tiny_gateway)
    time.sleep(0.3)
    assert tiny_gateway.engine.engine.step_count == started_before  # the engine never ran them
