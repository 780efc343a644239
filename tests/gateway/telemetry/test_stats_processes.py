"""The deployment-wide stats across real processes: one ``carpool serve --role gateway`` and two
``--role worker`` (echo engines) on one Redis. ``/admin/stats`` on the gateway shows all three
processes, every request the clients got an answer to, and engine numbers equal to the sum of
what each worker exports on its own ``/metrics``, although the gateway itself ran no step."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.process import free_port
from tests.gateway.harness import make_tenant
from tests.gateway.procs import spawn_all

pytestmark = pytest.mark.timeout(120)
ADMIN_KEY = "cp-admin-" + "m" * 32


def exported(port: int, sample: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return float(next(ln.split()[-1] for ln in text.splitlines() if ln.startswith(sample + " ")))


def test_one_picture_of_a_gateway_and_two_workers(redis_url: str, tiny_model_dir: Path,
                                                  tmp_path: Path) -> None:
    ns = f"t{uuid.uuid4().hex[:10]}"
    with contextlib.ExitStack() as stack:
        ports = [free_port(), free_port()]
        gw, *_ = stack.enter_context(spawn_all(
            redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []),
            *[("worker", ["--metrics-port", str(p), "--echo-step-ms", "2"]) for p in ports],
            env={"CARPOOL_ADMIN_KEY": ADMIN_KEY}))
        key = make_tenant(redis_url, ns, "multi-co")
        served = 0
        with httpx.Client(timeout=30) as client:
            for _ in range(10):
                r = client.post(gw.url + "/v1/completions",
                                headers={"Authorization": f"Bearer {key}"},
                                json={"model": "echo", "prompt": "split roles", "max_tokens": 6})
                served += r.status_code == 200
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            seats = sum(exported(p, "carpool_engine_max_num_seqs") for p in ports)
            deadline = time.monotonic() + 20
            while True:  # the next publish and sample carry it all
                steps = sum(exported(p, "carpool_engine_batch_size_count") for p in ports)
                stats = client.get(gw.url + "/admin/stats", headers=admin).json()
                roles = sorted(stats["processes"].values())
                done = stats["tiers"]["interactive"]["counts"]["completed"]
                if (roles == ["gateway", "worker", "worker"] and done == served
                        and stats["engine"] and stats["engine"]["batch_size"]["count"] == steps):
                    break
                assert time.monotonic() < deadline, (roles, done, served, stats["engine"])
                time.sleep(0.5)
        metrics = httpx.get(gw.url + "/metrics").text
    assert served == 10 and steps > 0
    assert stats["engine"]["max_num_seqs"] == seats
    assert "carpool_engine_batch_size_count 0.0" in metrics  # the gateway itself ran no step
