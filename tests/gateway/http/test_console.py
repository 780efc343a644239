"""The console's HTTP side: the page is a data-free shell, ``/admin/stats`` (its data) needs an
admin key, and under load the stats count what the clients saw (requests sent, 429s
received), through a real uvicorn server, the echo engine and Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway.harness import make_tenant

pytestmark = pytest.mark.timeout(60)
ADMIN_KEY = "cp-admin-" + "c" * 32
BODY = {"model": "echo", "prompt": "hello console", "max_tokens": 4}


@pytest.fixture(scope="module")
def admin(echo_gateway: Any) -> dict[str, str]:
    echo_gateway.call(echo_gateway.services.store.add_admin_key(ADMIN_KEY))
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def wait_for(fetch: Callable[[], dict[str, Any]], ok: Callable[[dict[str, Any]], bool],
             timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = fetch()
        if ok(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.3)


def test_page_is_a_shell_without_a_key(echo_gateway: Any) -> None:
    r = httpx.get(echo_gateway.url + "/console")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="login-form"' in r.text and ADMIN_KEY not in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for name, kind in (("console.js", "javascript"), ("console.css", "css")):
        asset = httpx.get(f"{echo_gateway.url}/console/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
    js = httpx.get(echo_gateway.url + "/console/console.js").text
    assert "sessionStorage" in js and "http://" not in js.replace("http://www.w3.org", "")
    assert httpx.get(echo_gateway.url + "/console/secret.txt").status_code == 404


def _revoked_key(echo_gateway: Any, redis_url: str) -> str:
    key = make_tenant(redis_url, echo_gateway.config.namespace, "revoked-co")
    echo_gateway.call(echo_gateway.services.store.revoke_key("revoked-co", key))
    time.sleep(echo_gateway.config.auth_cache_s + 0.1)
    return key


@pytest.mark.parametrize("kind", ["missing", "wrong", "malformed", "tenant", "revoked"])
def test_stats_and_page_refuse_anything_but_an_admin_key(
        echo_gateway: Any, redis_url: str, admin: dict[str, str], kind: str) -> None:
    headers = {
        "missing": {},
        "wrong": {"Authorization": "Bearer cp-admin-" + "x" * 32},
        "malformed": {"Authorization": "Basic Zm9vOmJhcg=="},
        "tenant": {"Authorization": "Bearer " + make_tenant(
            redis_url, echo_gateway.config.namespace, "plain-co")},
        "revoked": {"Authorization": "Bearer " + _revoked_key(echo_gateway, redis_url)},
    }[kind]
    r = httpx.get(echo_gateway.url + "/admin/stats", headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] in ("missing_api_key", "invalid_admin_key")
    page = httpx.get(echo_gateway.url + "/console", headers=headers)
    if kind in ("missing", "malformed"):  # no key presented: the sign-in shell
        assert page.status_code == 200
    else:
        assert page.status_code == 401 and page.json()["error"]["code"] == "invalid_admin_key"
    assert httpx.get(echo_gateway.url + "/admin/stats", headers=admin).status_code == 200


def test_stats_count_what_clients_saw(echo_gateway: Any, redis_url: str,
                                      admin: dict[str, str]) -> None:
    ns = echo_gateway.config.namespace
    busy = make_tenant(redis_url, ns, "busy-co")
    capped = make_tenant(redis_url, ns, "capped-co", rpm=2)
    sent = {"busy-co": 0, "capped-co": 0}
    refused = 0
    for i in range(12):
        tenant, key = ("busy-co", busy) if i % 2 else ("capped-co", capped)
        r = httpx.post(echo_gateway.url + "/v1/completions",
                       headers={"Authorization": f"Bearer {key}"}, json=BODY, timeout=30)
        if r.status_code == 429:
            refused += 1
        else:
            assert r.status_code == 200
            sent[tenant] += 1
    assert refused > 0  # the rpm=2 tenant was refused

    def fetch() -> dict[str, Any]:
        return httpx.get(echo_gateway.url + "/admin/stats", headers=admin).json()

    def tenants(stats: dict[str, Any]) -> dict[str, Any]:
        return {row["tenant"]: row for row in stats["tenants"]}

    def derived(stats: dict[str, Any]) -> bool:  # the worker's status published a target
        return any(b["target_s"] for b in stats["step_budget"].values())

    stats = wait_for(fetch, lambda s: tenants(s).get("busy-co", {}).get("requests") == sent["busy-co"]
                     and tenants(s).get("capped-co", {}).get("rejected_429") == refused
                     and derived(s))
    rows = tenants(stats)
    assert rows["busy-co"]["requests"] == sent["busy-co"]
    assert rows["capped-co"]["requests"] == sent["capped-co"]
    assert rows["capped-co"]["rejected_429"] == refused
    assert rows["busy-co"]["tokens"] > 0 and rows["busy-co"]["ttft_p99_s"] is not None
    tier = stats["tiers"]["interactive"]
    assert tier["ttft_s"]["count"] >= sum(sent.values())
    assert tier["ttft_s"]["p50"] is not None and tier["ttft_s"]["p50"] > 0
    assert stats["engine"] is not None and stats["engine"]["max_num_seqs"] > 0
    assert stats["admitted"] >= sum(sent.values())  # the Redis counters stay at the top level
    assert stats["doctor"]["healthy"], stats["doctor"]["findings"]
    # the worker's step budget as /admin/tiers has it: its target derived from the steps run
    budgets = stats["step_budget"]
    assert len(budgets) == 1 and next(iter(budgets.values()))["target_s"] > 0, budgets
    assert set(next(iter(budgets.values()))) >= {"cap", "gain", "alone_bias", "backlogged"}
