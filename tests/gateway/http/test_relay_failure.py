"""A relay that fails with an unexpected error cancels its request end to end: the engine
stops generating, the output stream is deleted and the abort is counted (echo engine)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from gateway.http.relay import RelayResponse
from tests.gateway.cancel_helpers import stat, wait_clean
from tests.gateway.harness import make_tenant

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
