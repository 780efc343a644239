"""Server-side deadline: a request still running when its total time is up is cancelled end to
end; the client gets a 504 (or an SSE error event), the engine drops it, nothing is left."""

from __future__ import annotations

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
