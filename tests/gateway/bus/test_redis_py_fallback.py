"""The whole request path on redis-py alone: what a TLS or unix-socket REDIS_URL runs, since
the lean RESP connection is only used for plain TCP (``RespConnection.for_client`` -> None).
Admission and settle, the queue claim and acks, the per-step output script and the relay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.bus.keys import RedisKeys
from gateway.bus.resp import RespConnection
from tests.gateway.harness import make_config, make_tenant, redis_sync, run_gateway

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def redis_py_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RespConnection, "for_client", classmethod(lambda cls, redis: None))
        config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0)
        with run_gateway(config, redis_url) as gw:
            assert gw.services.quota._conn is None  # really on redis-py
            yield gw


def test_completions_stream_and_quota_settle_on_redis_py(redis_py_gateway: Any,
                                                         redis_url: str) -> None:
    gw, ns = redis_py_gateway, redis_py_gateway.config.namespace
    key = make_tenant(redis_url, ns, "fallback", max_concurrency=4)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": gw.services.model.name, "prompt": "one two three", "max_tokens": 3}
    with httpx.Client(base_url=gw.url, headers=headers, timeout=30) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        events = []
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(e["choices"][0]["text"] for e in events) == r.json()["choices"][0]["text"]
    # settled: no concurrency slot held, no output stream left behind
    sync = redis_sync(redis_url)
    keys = RedisKeys(ns)
    assert sync.zcard(keys.concurrency("fallback")) == 0
    assert not [k for k in sync.scan_iter(match=f"{ns}:*:out:*")]
