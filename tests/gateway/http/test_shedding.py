"""Early shedding end to end on the echo gateway: with the drainer held, a backlog builds in a
tier whose TTFT target is tiny; once the worker has published it, a new request is answered
at once with 503 tier_saturated (or 429 tenant_over_share for the tenant holding more than its
share of the queue) and Retry-After, while a tier configured to queue keeps queueing. The
published status (``GET /admin/tiers``, ``carpool tenants tiers``) shows the backlog sent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.tenant_views import format_laws
from gateway.http.shedding import step_costs
from policies.tiers import BATCH, INTERACTIVE, TierSLO
from tests.gateway.harness import SECRET, make_config, make_tenant, run_gateway
from tests.gateway.worker.drainer_hold import HeldWorker, drainer_held, start_drainer

pytestmark = pytest.mark.timeout(90)

ADMIN_KEY = "cp-admin-" + "s" * 32
SLOS = {INTERACTIVE: TierSLO(ttft_p99_s=0.05, action="shed"),
        BATCH: TierSLO(ttft_p99_s=0.05, action="queue")}


@pytest.fixture(scope="module")
def shed_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0,
                         tier_slos=SLOS)
    with run_gateway(config, redis_url, worker_type=HeldWorker) as gw:
        gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
        yield gw


def tenants_cli(redis_url: str, ns: str, *args: str) -> str:
    """``carpool tenants ARGS`` in a fresh interpreter, which must not import torch."""
    probe = ("import sys; from gateway.cli.main import main; rc = main(sys.argv[1:]); "
             "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    env = {"REDIS_URL": redis_url, "CARPOOL_NAMESPACE": ns, "CARPOOL_SECRET": SECRET.decode(),
           "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", probe, "tenants", *args], env=env,
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def body(tier: str) -> dict[str, Any]:
    return {"model": "echo", "prompt": "x", "max_tokens": 1, "service_tier": tier}


async def wait_for_status(c: httpx.AsyncClient, tier: str, depth: int) -> dict[str, Any]:
    """The tier's row of /admin/tiers once the workers published ``depth`` waiting entries,
    then long enough for the gateway's cached status to have been re-read."""
    deadline = time.monotonic() + 10
    while True:
        rows = (await c.get("/admin/tiers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                ).json()["data"]
        row = next(r for r in rows if r["tier"] == tier)
        if row["status"] is not None and row["status"]["depth"] == depth:
            await asyncio.sleep(1.1)  # the shedder re-reads at most once a second
            return row
        assert time.monotonic() < deadline, row
        await asyncio.sleep(0.05)


def test_saturated_tier_sheds_at_once_and_a_queue_tier_keeps_queueing(
        shed_gateway: Any, redis_url: str) -> None:
    ns = shed_gateway.config.namespace
    heavy, light = (make_tenant(redis_url, ns, t) for t in ("heavy", "light"))

    async def go() -> None:
        async with httpx.AsyncClient(base_url=shed_gateway.url, timeout=60,
                                     limits=httpx.Limits(max_connections=64)) as c:
            def post(key: str, tier: str) -> Any:
                return c.post("/v1/completions", json=body(tier),
                              headers={"Authorization": f"Bearer {key}"})

            # nothing published about a backlog yet: everything queues
            queued = [asyncio.create_task(post(heavy, INTERACTIVE)) for _ in range(4)]
            queued.append(asyncio.create_task(post(light, INTERACTIVE)))
            queued += [asyncio.create_task(post(heavy, BATCH)) for _ in range(2)]
            row = await wait_for_status(c, INTERACTIVE, 5)
            assert row["status"]["tenants"] == {"heavy": 4, "light": 1}
            assert row["ttft_p99_s"] == 0.05 and row["action"] == "shed"
            admin = (await c.get("/admin/tiers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                     ).json()
            # each live worker's step budget as it decided last (no interactive step ran
            # yet: nothing decided, no cap)
            assert list(admin["step_budget"]) == admin["workers"]
            for b in admin["step_budget"].values():
                assert set(b) == {"cap", "target_s", "gain", "cap_target_s", "alone_bias",
                                  "backlogged", "lower_prefill_tokens", "row_limit"}, b
                assert b["cap"] is None and b["gain"] == 1.0 and not b["backlogged"], b
            table = await asyncio.to_thread(tenants_cli, redis_url, ns, "tiers")
            line = next(ln for ln in table.splitlines() if ln.startswith(INTERACTIVE))
            assert line.split()[:6] == [INTERACTIVE, "6", "0.05s", "-", "shed", "5"], table
            assert line.endswith("heavy=4 light=1"), table
            listed = await asyncio.to_thread(tenants_cli, redis_url, ns, "list")
            lines = [json.loads(ln) for ln in listed.splitlines()]
            assert [ln.get("id") for ln in lines[:2]] == ["heavy", "light"]
            assert [ln.get("tier") for ln in lines[2:]] == [INTERACTIVE, BATCH, "best-effort"]
            assert lines[2]["ttft_p99_s"] == 0.05 and lines[2]["action"] == "shed"

            t0 = time.monotonic()
            over = await post(heavy, INTERACTIVE)  # 4 of 5 queued: over its share of 2.5
            saturated = await post(light, INTERACTIVE)  # 1 of 5: under it
            assert time.monotonic() - t0 < 2.0  # answered at once, not after a wait
            assert over.status_code == 429, over.text
            assert over.json()["error"]["code"] == "tenant_over_share"
            assert saturated.status_code == 503, saturated.text
            assert saturated.json()["error"]["code"] == "tier_saturated"
            for r in (over, saturated):
                assert int(r.headers["Retry-After"]) >= 1

            await wait_for_status(c, BATCH, 2)  # batch is as saturated, but queues
            queued += [asyncio.create_task(post(light, BATCH)) for _ in range(2)]
            await wait_for_status(c, BATCH, 4)
            start_drainer(shed_gateway)
            done = await asyncio.gather(*queued)
            assert [r.status_code for r in done] == [200] * len(queued)

    with drainer_held(shed_gateway):
        asyncio.run(go())


def test_tenants_tiers_prints_each_live_workers_step_law() -> None:
    law = {"base_s": 0.0215, "per_row_s": 0.00125, "per_token_s": 0.0018,
           "per_kv_token_s": 2.5e-6, "per_prefill_row_s": 0.0192, "kv_per_row": 87.4,
           "prefill_tokens": 44.0, "steps": 512.0}
    state = {"cap": 6, "target_s": 0.036, "gain": 0.75, "cap_target_s": 0.027,
             "alone_bias": 1.125, "backlogged": True, "lower_prefill_tokens": 16,
             "row_limit": 40}
    statuses = [{"worker": "w2", "step_cost": law, "step_budget": state},
                {"worker": "w1", "step_cost": None,
                 "step_budget": {**state, "cap": None, "alone_bias": None, "backlogged": False}},
                {"worker": "w3"}]
    assert step_costs(statuses) == {"w2": law}  # a cold worker (or an older one) has none
    text = format_laws(statuses)
    assert text == ("worker w2: step ~ 21.5 ms + 1.25 ms/row + 1.80 ms/token + "
                    "2.50 us/context token + 19.2 ms/prompt row (512 steps, 87 context tokens "
                    "a row)\n"
                    "worker w2: interactive TPOT target 36 ms, cap priced at x0.75 = 27 ms: "
                    "row cap 6, alone bias x1.12, interactive backlogged (seats owed for every "
                    "row)\n"
                    "worker w1: interactive TPOT target 36 ms, cap priced at x0.75 = 27 ms: "
                    "no row cap, alone bias -\n")
