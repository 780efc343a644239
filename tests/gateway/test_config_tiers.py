"""Per-tier service objectives in GatewayConfig: from the tenants file's [tiers.<name>] tables,
then CARPOOL_TIER_SLOS field by field, then explicit values (flags, tests) per tier; every
tier always has one; bad input is refused when the config is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import GatewayConfig, parse_tier_slos
from policies.tiers import DEFAULT_TIER_SLOS, DEFAULT_TIER_WEIGHTS, TIERS, TierSLO

TIERS_TOML = """
[tenants.acme]
rpm = 10

[tiers.interactive]
ttft_p99_s = 2.0
tpot_p99_s = 0.4
action = "shed"
weight = 8

[tiers.best-effort]
ttft = 300
"""


def test_defaults_cover_every_tier() -> None:
    assert dict(GatewayConfig().tier_slos) == DEFAULT_TIER_SLOS
    assert set(GatewayConfig.from_env({}).tier_slos) == set(TIERS)


def test_env_string() -> None:
    env = {"CARPOOL_TIER_SLOS": "interactive=ttft:2,tpot:0.5,shed; flex=ttft:120,queue"}
    slos = GatewayConfig.from_env(env).tier_slos
    assert slos["interactive"] == TierSLO(2.0, 0.5, "shed")
    assert slos["batch"] == TierSLO(120.0, None, "queue")  # "flex" is batch's alias
    assert slos["best-effort"] == DEFAULT_TIER_SLOS["best-effort"]


def test_file_tables_then_env_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(TIERS_TOML)
    config = GatewayConfig.from_env({"CARPOOL_TIER_SLOS": "interactive=ttft:1.5"},
                                    tenants_file=str(path))
    assert config.tier_slos["interactive"] == TierSLO(1.5, 0.4, "shed")  # env's ttft only
    assert config.tier_slos["best-effort"] == TierSLO(300.0, None, "queue")
    assert config.tier_weights == {**DEFAULT_TIER_WEIGHTS, "interactive": 8}
    # CARPOOL_TIER_WEIGHTS wins over the file's weights
    env = {"CARPOOL_TIER_WEIGHTS": "interactive=5,batch=1,best-effort=1"}
    assert GatewayConfig.from_env(env, tenants_file=str(path)).tier_weights["interactive"] == 5


def test_explicit_values_win_per_tier(tmp_path: Path) -> None:
    env = {"CARPOOL_TIER_SLOS": "interactive=ttft:2,shed;batch=ttft:60"}
    config = GatewayConfig.from_env(env, tier_slos={"interactive": TierSLO(tpot_p99_s=0.3)})
    assert config.tier_slos["interactive"] == TierSLO(None, 0.3, "queue")
    assert config.tier_slos["batch"] == TierSLO(60.0)


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tiers:\n  batch:\n    ttft_p99_s: 30\n    action: shed\n")
    assert GatewayConfig.from_env({}, tenants_file=str(path)).tier_slos["batch"] == \
        TierSLO(30.0, None, "shed")


@pytest.mark.parametrize("raw", ["gold=ttft:1", "interactive=ttft:0", "interactive=ttft:x",
                                 "interactive=drop", "interactive=latency:1", "interactive"])
def test_bad_env_strings_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        GatewayConfig.from_env({"CARPOOL_TIER_SLOS": raw})


def test_bad_file_tables_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    for body in ("[tiers.gold]\nttft = 1", "[tiers.batch]\nlatency = 1",
                 "[tiers.batch]\naction = 'drop'", "tiers = 3"):
        path.write_text(body)
        with pytest.raises(ValueError):
            GatewayConfig.from_env({}, tenants_file=str(path))


def test_config_refuses_unknown_tiers_and_fills_missing_ones() -> None:
    with pytest.raises(ValueError):
        GatewayConfig(tier_slos={"gold": TierSLO()})
    config = GatewayConfig(tier_slos={"batch": TierSLO(5.0)})
    assert config.tier_slos["batch"] == TierSLO(5.0)
    assert config.tier_slos["interactive"] == DEFAULT_TIER_SLOS["interactive"]


def test_parse_keeps_only_given_fields() -> None:
    assert parse_tier_slos("batch=tpot:0.2") == {"batch": {"tpot_p99_s": 0.2}}
    assert parse_tier_slos("") == {}


def test_a_flag_string_wins_over_env_field_by_field() -> None:
    env = {"CARPOOL_TIER_SLOS": "interactive=ttft:2,tpot:0.5,shed"}
    config = GatewayConfig.from_env(env, tier_slos="interactive=ttft:1;batch=queue")
    assert config.tier_slos["interactive"] == TierSLO(1.0, 0.5, "shed")
    assert config.tier_slos["batch"] == DEFAULT_TIER_SLOS["batch"]


def test_serve_flag_reaches_the_config() -> None:
    from gateway.cli.main import CONFIG_FLAGS, build_parser

    args = build_parser().parse_args(["serve", "--tier-slos", "batch=ttft:30,shed"])
    config = GatewayConfig.from_env({}, **{k: getattr(args, k) for k in CONFIG_FLAGS})
    assert config.tier_slos["batch"] == TierSLO(30.0, None, "shed")


def test_the_tpot_budget_is_a_tier_field_from_file_env_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[tiers.interactive]\ntpot_budget = 1.5\n")
    from_file = GatewayConfig.from_env({}, tenants_file=str(path))
    assert from_file.tier_slos["interactive"].tpot_budget_x == 1.5
    env = {"CARPOOL_TIER_SLOS": "interactive=tpot_budget:1.8"}
    assert GatewayConfig.from_env(env).tier_slos["interactive"].tpot_budget_x == 1.8
    flag = GatewayConfig.from_env(env, tier_slos="interactive=tpot_budget:2,ttft:1")
    assert flag.tier_slos["interactive"] == TierSLO(1.0, None, "queue", 2.0)
    assert GatewayConfig.from_env({}).tier_slos["interactive"].tpot_budget_x is None  # 1.2x
    for bad in ("interactive=tpot_budget:0.9", "interactive=tpot_budget:11",
                "interactive=tpot_budget:x"):
        with pytest.raises(ValueError):
            GatewayConfig.from_env({"CARPOOL_TIER_SLOS": bad})
