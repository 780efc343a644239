"""Budgets over real HTTP and Redis: a tenant over its period's budget gets 429
``budget_exceeded`` with the period's reset, admission is atomic under a concurrent burst, the
tenant is never charged past the budget by more than one reservation, and the period's spend
equals the ledger's (tokens, or cost at the model's price)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.budget import Price, period_window
from tests.gateway.harness import make_config, make_tenant, run_gateway
from tests.gateway.http.ledger_helpers import a_prompt, ledger_total

pytestmark = pytest.mark.timeout(120)
ADMIN_KEY = "cp-admin-" + "b" * 32
BODY = {"model": "echo", "prompt": a_prompt(5), "max_tokens": 10}  # reserves 15 tokens


@pytest.fixture(scope="module")
def priced(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0,
                         prices={"echo": Price(prompt=1.0, cached=0.5, completion=4.0)})
    with run_gateway(config, redis_url) as gw:
        gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
        yield gw


async def burst(url: str, key: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=60) as c:
        return list(await asyncio.gather(*(c.post("/v1/completions", json=BODY)
                                           for _ in range(n))))


def spent(gw: Any, tenant: str, period: str) -> int:
    key = gw.services.keys.budget(tenant, period_window(period, time.time())[0])
    return int(gw.call(gw.services.redis.get(key)) or 0)


def test_token_budget_under_a_burst(priced: Any, redis_url: str) -> None:
    gw = priced
    key = make_tenant(redis_url, gw.config.namespace, "tok", budget_tokens=100,
                      budget_period="daily")
    sent = time.time()
    res = asyncio.run(burst(gw.url, key, 20))
    ok = [r for r in res if r.status_code == 200]
    assert len(ok) == 7  # reservations of 15 are admitted while the spend is below 100
    for r in res:
        if r.status_code != 200:
            err = r.json()["error"]
            assert r.status_code == 429 and err["code"] == "budget_exceeded", r.text
            assert "daily budget (100 tokens)" in err["message"] and "resets at" in err["message"]
            reset = period_window("daily", sent)[1]  # (a burst across midnight: moot)
            assert 1 <= int(r.headers["retry-after"]) <= reset - sent + 1
    row = ledger_total(gw, "tok", requests=7)
    used = row.prompt_tokens + row.completion_tokens
    assert used == sum(r.json()["usage"]["total_tokens"] for r in ok) == 105
    assert spent(gw, "tok", "daily") == used <= 100 + 15  # one reservation past, at most
    late = httpx.post(gw.url + "/v1/completions", json=BODY,
                      headers={"Authorization": f"Bearer {key}"})
    assert late.status_code == 429 and late.json()["error"]["code"] == "budget_exceeded"


def test_cost_budget_and_ledger_cost(priced: Any, redis_url: str) -> None:
    gw = priced
    # 5 prompt tokens at 1 + 10 completion at 4 per 1M: 45 micro-units a request
    key = make_tenant(redis_url, gw.config.namespace, "cost", budget_cost=0.0001)
    codes = [r.status_code for r in asyncio.run(burst(gw.url, key, 6))]
    assert codes.count(200) == 3 and codes.count(429) == 3
    row = ledger_total(gw, "cost", requests=3)
    assert row.cost_micro == 135 and row.to_json()["cost"] == 0.000135
    assert spent(gw, "cost", "monthly") == 135


def test_bad_budgets_are_400_and_change_nothing(priced: Any, redis_url: str) -> None:
    gw = priced
    make_tenant(redis_url, gw.config.namespace, "steady", budget_tokens=500)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for body, words in (({"budget_tokens": -5}, "budget_tokens"),
                        ({"budget_tokens": 10**18}, "budget_tokens"),
                        ({"budget_cost": 1e15}, "budget_cost"),
                        ({"budget_cost": 2.0}, "not both"),
                        ({"budget_period": "weekly"}, "budget_period")):
        r = httpx.patch(gw.url + "/admin/tenants/steady", headers=admin, json=body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = httpx.patch(gw.url + "/admin/tenants/nobody", headers=admin, json={"budget_tokens": 5})
    assert r.status_code == 404 and r.json()["error"]["code"] == "tenant_not_found"
    (t,) = [t for t in httpx.get(gw.url + "/admin/tenants", headers=admin).json()["data"]
            if t["id"] == "steady"]
    assert (t["budget_tokens"], t["budget_cost"], t["budget_period"]) == (500, 0.0, "monthly")
    r = httpx.patch(gw.url + "/admin/tenants/steady", headers=admin,
                    json={"budget_tokens": 0, "budget_cost": 2.5, "budget_period": "daily"})
    assert r.status_code == 200 and r.json()["budget_cost"] == 2.5
