"""The tenants file format (TOML, and YAML with the same shape) and its validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.tenancy.tenants import TenantQuota, load_tenants_file

REPO = Path(__file__).resolve().parents[3]


def test_example_file_loads() -> None:
    tenants = {t.id: t for t in load_tenants_file(REPO / "tenants.example.toml")}
    assert set(tenants) == {"acme", "nightly-jobs", "free-tier"}
    assert tenants["acme"].quota.rpm == 600 and tenants["acme"].quota.tpm == 200_000
    assert tenants["nightly-jobs"].quota.allowed_tiers == ("batch", "best-effort")
    assert tenants["free-tier"].quota.default_tier == "best-effort"
    assert tenants["nightly-jobs"].quota.max_prompt_tokens == 0  # unlimited


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
])
def test_invalid_files_are_rejected(tmp_path: Path, body: str, words: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(f"[tenants.x]\n{body}\n")
    with pytest.raises(ValueError, match=words):
        load_tenants_file(path)
