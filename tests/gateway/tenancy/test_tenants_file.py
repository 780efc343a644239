"""The tenants file format (TOML, and YAML with the same shape) and its validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tenancy.tenants import Tenant, TenantQuota, load_tenants_file

REPO = Path(__file__).resolve().parents[3]


def test_example_file_loads() -> None:
    tenants = {t.id: t for t in load_tenants_file(REPO / "tenants.example.toml")}
    assert set(tenants) == {"acme", "nightly-jobs", "free-tier"}
    assert tenants["acme"].quota.rpm == 600 and tenants["acme"].quota.tpm == 200_000
    assert tenants["nightly-jobs"].quota.allowed_tiers == ("batch", "best-effort")
    assert tenants["free-tier"].quota.default_tier == "best-effort"
    assert tenants["nightly-jobs"].quota.max_prompt_tokens == 0  # unlimited
    assert tenants["nightly-jobs"].weight == 2.0 and tenants["acme"].weight == 1.0  # default


def test_yaml_same_shape(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("tenants:\n  a:\n    rpm: 5\n    allowed_tiers: [batch]\n"
                    "    default_tier: batch\n")
    (tenant,) = load_tenants_file(path)
    assert tenant.quota == TenantQuota(rpm=5, allowed_tiers=("batch",), default_tier="batch")


@pytest.mark.parametrize("body,words", [
    ("rpm = -1", "rpm"),
    ("rpm = 'ten'", "rpm"),
    ("colour = 'red'", "unknown fields"),
    ("allowed_tiers = ['gold']", "unknown tier"),
    ("allowed_tiers = ['batch']\ndefault_tier = 'interactive'", "not in allowed_tiers"),
    ("weight = 0", "weight"),
    ("weight = -2.5", "weight"),
    ("weight = 'heavy'", "weight"),
    ("weight = true", "weight"),
    ("weight = inf", "weight"),
])
def test_invalid_files_are_rejected(tmp_path: Path, body: str, words: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(f"[tenants.x]\n{body}\n")
    with pytest.raises(ValueError, match=words):
        load_tenants_file(path)


def test_weight_round_trips_through_the_store(redis_url: str) -> None:
    import asyncio

    from tests.gateway.harness import store_for

    async def go() -> None:
        client, store = store_for(redis_url, "tw-store")
        try:
            await store.put(Tenant("w", "w", weight=0.25))
            got = await store.get("w")
            assert got is not None and got.weight == 0.25
            updated = await store.set_quota("w", rpm=3, weight=1.5)
            assert (updated.weight, updated.quota.rpm) == (1.5, 3)
            assert await store.get("w") == updated
            await store.put(Tenant("v"))
            got = await store.get("v")
            assert got is not None and got.weight == 1.0
        finally:
            await client.delete(*[k async for k in client.scan_iter("tw-store:*")])
            await client.aclose()

    asyncio.run(go())
