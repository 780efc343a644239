"""``carpool doctor`` against running servers: a healthy one (echo engine) reports no symptom
and exits 0; one with a deliberately tiny KV pool (the real engine on the tiny model, a pool
smaller than the requests sent at once need) names recompute churn and exits 1, its evidence
agreeing with the engine's own preemption counter; a wrong key or no server exits 2."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.process import free_port
from policies.tiers import TierSLO
from tests.gateway.harness import make_config, make_tenant, run_gateway

pytestmark = pytest.mark.timeout(120)
ADMIN_KEY = "cp-admin-" + "d" * 32
REPO = Path(__file__).resolve().parents[3]
# 8 blocks of 16 tokens: one 40 + 80 token request fills the pool, eight at once churn
TINY_POOL = {"num_blocks": 8, "block_size": 16, "max_num_seqs": 8, "max_model_len": 128}


def doctor(url: str, key: str = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli.main", "doctor", "--url", url,
                           "--admin-key", key, "--wait", "10"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)


def send(gw: Any, key: str, n: int, max_tokens: int, prompt: str) -> list[int]:
    def one(_: int) -> int:
        r = httpx.post(gw.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": gw.services.model.name, "prompt": prompt, "max_tokens": max_tokens,
                             "ignore_eos": True}, timeout=90)
        return r.status_code

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_healthy_server_has_no_symptom(echo_gateway: Any, redis_url: str) -> None:
    echo_gateway.call(echo_gateway.services.store.add_admin_key(ADMIN_KEY))
    key = make_tenant(redis_url, echo_gateway.config.namespace, "doc-co")
    assert send(echo_gateway, key, 4, 8, "hello doctor") == [200] * 4
    res = doctor(echo_gateway.url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no symptom" in res.stdout and "SYMPTOM" not in res.stdout
    assert "interactive: TTFT p50" in res.stdout and "engine: tokens/s" in res.stdout


def test_refused_key_or_no_server_exit_2(echo_gateway: Any) -> None:
    res = doctor(echo_gateway.url, "cp-admin-" + "z" * 32)
    assert res.returncode == 2 and "401" in res.stderr
    res = doctor(f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2 and "no answer" in res.stderr


def test_tiny_kv_pool_is_recompute_churn(redis_url: str, tiny_model_dir: Path) -> None:
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=TINY_POOL)
    with run_gateway(config, redis_url) as gw:
        gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
        key = make_tenant(redis_url, config.namespace, "churn-co")
        codes = send(gw, key, 8, 80, "one two three four five six seven eight " * 4)
        assert codes == [200] * 8
        preempted = gw.engine.stats().scheduler.preemptions_recompute
        assert preempted > 0  # the premise: the pool is too small for the batch
        res = doctor(gw.url)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SYMPTOM recompute_churn" in res.stdout
    assert f"recompute_preemptions={float(preempted)}" in res.stdout


def test_interactive_ttft_over_its_objective_names_the_largest_part(redis_url: str) -> None:
    """An objective no first token can meet (a 1 ms TTFT p99 beside 30 ms echo steps): the
    doctor says so and names the part of the TTFT budget that took the most, as the stats'
    own split has it."""
    config = make_config(echo_step_ms=30.0,
                         tier_slos={"interactive": TierSLO(ttft_p99_s=0.001)})
    with run_gateway(config, redis_url) as gw:
        gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
        key = make_tenant(redis_url, config.namespace, "slow-co")
        assert send(gw, key, 6, 2, "hello doctor") == [200] * 6
        res = doctor(gw.url)
        stats = httpx.get(gw.url + "/admin/stats", timeout=30,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SYMPTOM ttft_over_objective" in res.stdout
    split = stats["tiers"]["interactive"]["ttft_split"]
    largest = max(split, key=lambda part: split[part]["p99"] or 0.0)
    assert f"largest_part={largest}" in res.stdout
