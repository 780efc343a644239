"""The drain deadline (``drain_timeout_s``): from ``CARPOOL_DRAIN_TIMEOUT_S`` or
``--drain-timeout``, 30 s by default, 0 allowed (a worker hands off at once), checked once
when the config is built."""

from __future__ import annotations

import pytest

from gateway.cli.main import CONFIG_FLAGS, build_parser
from gateway.config import GatewayConfig


def test_default_env_and_flag() -> None:
    assert GatewayConfig().drain_timeout_s == 30.0
    assert GatewayConfig.from_env({"CARPOOL_DRAIN_TIMEOUT_S": "0"}).drain_timeout_s == 0.0
    args = build_parser().parse_args(["serve", "--drain-timeout", "12.5"])
    assert "drain_timeout_s" in CONFIG_FLAGS
    config = GatewayConfig.from_env({"CARPOOL_DRAIN_TIMEOUT_S": "3"},
                                    drain_timeout_s=args.drain_timeout_s)
    assert config.drain_timeout_s == 12.5  # the flag wins


@pytest.mark.parametrize("bad", [-1.0, 3601.0])
def test_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="drain_timeout_s"):
        GatewayConfig(drain_timeout_s=bad)
