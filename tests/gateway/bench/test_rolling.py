"""``carpool bench rolling`` on the tiny real model: a worker and then a gateway of 2 gateways
and 3 workers replaced one at a time under steady streaming load. No client sees
an error; every stream has the text and token counts of an uninterrupted greedy run (nothing
lost, repeated or reordered), including those a stopping worker handed to another mid-stream;
every stopped process exits 0; no lease, pending entry, output stream or KV block is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bench.rolling import parse_args, run, table
from tests.gateway.faults.test_worker_death import ENGINE

pytestmark = pytest.mark.timeout(420)


def test_a_rolling_restart_under_load_has_zero_errors(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    # a worker drain of 0: each stopped worker hands its streams off mid-stream at once (the
    # bench stops a worker once it holds a request)
    # one worker and one gateway of the five are replaced (each replacement is the same
    # path; `carpool bench rolling` replaces all five, see docs/fleet.md)
    args = parse_args(["--clients", "4", "--max-tokens", "80", "--before", "2",
                       "--after", "1", "--gateway-drain", "10", "--worker-drain", "0",
                       "--each", "1",
                       *(f"--serve-arg={a}" for a in ENGINE)])
    report = run(redis_url, str(tiny_model_dir), args, tmp_path)
    print("\n".join(table(report)))
    assert report.errors() == []
    roll = [r for r in report.results if r.phase == "roll"]
    before = [r for r in report.results if r.phase == "before"]
    assert len(before) >= 4 and len(roll) >= 10, table(report)
    assert report.exit_codes == [0] * 2
    assert report.leftovers == {"leases": 0, "pending": 0, "out_streams": 0}
    assert report.kv_used == [0, 0, 0]
    assert report.handed_off >= 1 and report.resumed >= 1, table(report)
