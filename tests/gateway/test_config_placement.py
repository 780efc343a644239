"""Prefix-aware placement's settings: off by default, from ``CARPOOL_PLACEMENT_*`` or the
flags (the flag wins), checked once when the config is built; the gateway's ``Placement``
names a worker only when placement is on, a worker is live and the prompt has a full block."""

from __future__ import annotations

import pytest

from gateway.cli.main import CONFIG_FLAGS, build_parser
from gateway.config import GatewayConfig
from gateway.http.placement import Placement
from policies.placement import prefix_key, rank


def test_default_env_and_flag() -> None:
    assert GatewayConfig().placement_wait_ms == 0.0  # off
    env = {"CARPOOL_PLACEMENT_WAIT_MS": "50", "CARPOOL_PLACEMENT_BLOCKS": "4",
           "CARPOOL_PLACEMENT_LOAD_FACTOR": "2"}
    args = build_parser().parse_args(["serve", "--placement-wait-ms", "80"])
    assert {"placement_wait_ms", "placement_blocks", "placement_load_factor"} <= set(CONFIG_FLAGS)
    config = GatewayConfig.from_env(env, placement_wait_ms=args.placement_wait_ms)
    assert (config.placement_wait_ms, config.placement_blocks,
            config.placement_load_factor) == (80.0, 4, 2.0)


@pytest.mark.parametrize("bad", [{"placement_wait_ms": -1.0}, {"placement_wait_ms": 10_001.0},
                                 {"placement_blocks": 0}, {"placement_load_factor": 0.5}])
def test_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="placement"):
        GatewayConfig(**bad)  # type: ignore[arg-type]


def test_the_edge_prefers_the_rendezvous_worker() -> None:
    workers = ["w-a", "w-b", "w-c"]
    prompt = list(range(40))  # two full blocks of 16
    off = Placement(GatewayConfig())
    on = Placement(GatewayConfig(placement_wait_ms=50, placement_blocks=2))
    assert off.prefer(workers, prompt) == ""
    assert on.prefer([], prompt) == "" and on.prefer(workers, prompt[:15]) == ""
    key = prefix_key(prompt, 16, 2)
    assert key is not None
    assert on.prefer(workers, prompt) == rank(key, workers)[0]
