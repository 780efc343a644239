"""The usage ledger over real HTTP and Redis: the completion tokens it records for a tenant
equal the sum its clients received, for answers read whole, streams, streams cut by the
client, explicit cancels and server timeouts; ``/admin/usage`` (JSON, CSV) and ``/v1/usage``
(own tenant only) read it, and bad input is a 4xx."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.harness import make_config, make_tenant, run_gateway
from tests.gateway.http.ledger_helpers import (
    a_prompt,
    cut_stream,
    ledger_total,
    sse_tokens,
    stream_over_http,
)
from tests.gateway.worker.drainer_hold import HeldWorker, start_drainer, stop_drainer

pytestmark = pytest.mark.timeout(120)
ADMIN_KEY = "cp-admin-" + "u" * 32


@pytest.fixture(scope="module")
def slow_echo(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """Echo at 20 ms a step with a 1 s deadline: long answers are cut by the server."""
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=20.0,
                         request_timeout_s=1.0)
    with run_gateway(config, redis_url, worker_type=HeldWorker) as gw:
        gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
        yield gw


def test_ledger_equals_what_clients_received(slow_echo: Any, redis_url: str) -> None:
    gw = slow_echo
    key = make_tenant(redis_url, gw.config.namespace, "exact")
    user = {"Authorization": f"Bearer {key}"}
    short = {"model": "echo", "prompt": a_prompt(12), "max_tokens": 8}
    received = []
    # read whole: usage.completion_tokens
    r = httpx.post(gw.url + "/v1/completions", headers=user, json=short, timeout=30)
    received.append(r.json()["usage"]["completion_tokens"])
    # streamed to the end, with the usage chunk
    received.append(stream_over_http(gw.url, key, {
        **short, "stream_options": {"include_usage": True}}))
    # cut by the client after 3 tokens
    received.append(gw.call(cut_stream(gw.app, key, {**short, "max_tokens": 12}, 3)))
    # cut by the server's 1 s deadline (50 tokens at 20 ms need ~1 s more)
    received.append(stream_over_http(gw.url, key, {
        "model": "echo", "prompt": a_prompt(100), "max_tokens": 100}))
    # cancelled while queued: nothing computed, nothing received
    stop_drainer(gw)
    try:
        with httpx.stream("POST", gw.url + "/v1/completions", headers=user, timeout=30,
                          json={**short, "stream": True}) as s:
            rid = s.headers["x-request-id"]
            c = httpx.post(gw.url + f"/v1/requests/{rid}/cancel", headers=user)
            assert c.json()["status"] == "cancelled"
            received.append(sse_tokens(s.read()))
    finally:
        start_drainer(gw)
    assert received[0] == received[1] == 8 and received[2] >= 3 and 0 < received[3] < 100
    row = ledger_total(gw, "exact", requests=len(received))
    assert row.requests == len(received)
    assert row.completion_tokens == sum(received)  # 0 drift
    assert row.prompt_tokens == 12 * 4 + 100
    assert row.errors == {"cancelled_by_client": 1, "timeout": 1, "cancelled": 1}
    # the worker adds what it computed at each finish: never less than what was delivered
    # (the cut stream's and the timed-out one's extra steps are the undelivered work)
    row = ledger_total(gw, "exact", requests=len(received))
    assert row.computed_tokens >= row.completion_tokens
    assert row.undelivered_tokens == row.computed_tokens - row.completion_tokens


def test_usage_endpoints(slow_echo: Any, redis_url: str) -> None:
    gw = slow_echo
    ns = gw.config.namespace
    key, other = make_tenant(redis_url, ns, "reader"), make_tenant(redis_url, ns, "nosy")
    body = {"model": "echo", "prompt": a_prompt(5), "max_tokens": 4}
    for _ in range(2):
        assert httpx.post(gw.url + "/v1/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}).status_code == 200
    ledger_total(gw, "reader", requests=2)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.get(gw.url + "/admin/usage", params={"tenant": "reader", "group_by": "day"},
                  headers=admin)
    assert r.status_code == 200, r.text
    (day,) = r.json()["data"]
    assert (day["tenant"], day["requests"], day["completion_tokens"]) == ("reader", 2, 8)
    assert len(day["hour"]) == 8
    csv = httpx.get(gw.url + "/admin/usage", params={"tenant": "reader", "group_by": "key"},
                    headers={**admin, "Accept": "text/csv"})
    assert csv.headers["content-type"].startswith("text/csv")
    head, line = csv.text.strip().split("\n")
    assert head.startswith("tenant,") and line.startswith("reader,,")
    # a tenant reads its own usage, never another's: 404 as if it did not exist
    mine = httpx.get(gw.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
    assert mine.status_code == 200 and mine.json()["data"][0]["tenant"] == "reader"
    nosy = {"Authorization": f"Bearer {other}"}
    theirs = httpx.get(gw.url + "/v1/usage", params={"tenant": "reader"}, headers=nosy)
    assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "tenant_not_found"
    assert httpx.get(gw.url + "/v1/usage", headers=nosy).json()["data"] == []
    assert httpx.get(gw.url + "/admin/usage", headers={"Authorization": f"Bearer {key}"}
                     ).status_code == 401
    # bad input: a clear 4xx with an OpenAI-style body
    for params, status, words in (
            ({"tenant": "nobody"}, 404, "No tenant"),
            ({"from": "2026-13-45"}, 400, "not a date"),
            ({"from": "2026-12-02", "to": "2026-12-01"}, 400, "after"),
            ({"group_by": "week"}, 400, "group_by")):
        r = httpx.get(gw.url + "/admin/usage", params=params, headers=admin)
        assert r.status_code == status and words in r.json()["error"]["message"], r.text
    empty = httpx.get(gw.url + "/admin/usage", headers={**admin, "Accept": "text/csv"},
                      params={"tenant": "reader", "from": "2020-01-01", "to": "2020-01-02"})
    assert empty.status_code == 404 and empty.json()["error"]["code"] == "no_usage"


def test_tenants_usage_cli(slow_echo: Any, redis_url: str) -> None:
    import subprocess
    import sys

    from tests.gateway.harness import SECRET

    gw = slow_echo
    key = make_tenant(redis_url, gw.config.namespace, "clico")
    assert httpx.post(gw.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "echo", "prompt": a_prompt(6), "max_tokens": 5},
                      timeout=30).status_code == 200
    ledger_total(gw, "clico", requests=1)
    env = {"REDIS_URL": redis_url, "CARPOOL_NAMESPACE": gw.config.namespace,
           "CARPOOL_SECRET": SECRET.decode(), "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> tuple[int, str]:
        res = subprocess.run([sys.executable, "-m", "gateway.cli.main", "tenants", "usage",
                              *args], env=env, capture_output=True, text=True, timeout=30,
                             check=False)
        return res.returncode, res.stdout + res.stderr

    today = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400))
    rc, out = cli("clico", "--from", today, "--by", "day")
    assert rc == 0, out
    head, line = out.strip().split("\n")
    assert head.split()[:3] == ["tenant", "day", "requests"]
    assert line.split()[0] == "clico" and line.split()[2:6] == ["1", "6", "0", "5"]
    rc, out = cli("clico", "--csv")
    assert rc == 0 and out.startswith("tenant,hour,key_id")
    assert cli("nobody")[0] == 1
    rc, out = cli("clico", "--from", "2026-12-09", "--to", "2026-12-01")
    assert rc == 2 and "after" in out
