"""A Redis error that is not an outage (here a tenant record of the wrong type, as a bad
script or a hand-edited key leaves it) is still answered 503 ``backend_unavailable``, never a
500, and is logged with its traceback once, not left unseen (``http/backend.py``)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from gateway.bus.keys import RedisKeys
from tests.gateway.harness import make_tenant, redis_sync


def test_a_redis_error_that_is_not_an_outage_is_a_503_and_is_logged_once(
        echo_gateway: Any, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    ns = echo_gateway.config.namespace
    key = make_tenant(redis_url, ns, "wrongtype")
    tenant_key = RedisKeys(ns).tenant("wrongtype")
    r = redis_sync(redis_url)
    r.delete(tenant_key)
    r.set(tenant_key, "not a hash")  # HGETALL on it: WRONGTYPE
    try:
        answers = []
        with httpx.Client(base_url=echo_gateway.url, timeout=10,
                          headers={"Authorization": f"Bearer {key}"}) as client:
            for _ in range(3):  # a failed lookup is not cached: each one meets the error
                answers.append(client.post("/v1/completions", json={
                    "model": "echo", "prompt": "hi", "max_tokens": 2}))
    finally:
        r.delete(tenant_key)
    for a in answers:
        assert a.status_code == 503, a.text
        assert a.json()["error"]["code"] == "backend_unavailable"
    logged = [rec for rec in caplog.records
              if rec.name == "carpool.gateway" and "WRONGTYPE" in rec.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info
