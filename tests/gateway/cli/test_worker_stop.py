"""``carpool serve --role worker`` stopped by SIGTERM with a stream in flight (a separate
gateway relays it) and a drain deadline of 0 with no other worker to hand it to: the worker
exits 0 with no traceback, and the stream ends at once with a worker-lost error event and
``[DONE]`` instead of waiting for a reclaim or the request's deadline; the
request leaves nothing behind in Redis (entry acked, lease settled, output stream gone)."""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.gateway.cancel_helpers import wait_clean
from tests.gateway.harness import make_tenant
from tests.gateway.procs import spawn_all

pytestmark = pytest.mark.timeout(120)


def test_sigterm_ends_the_streams_a_worker_runs(redis_url: str, tiny_model_dir: Path,
                                                tmp_path: Path) -> None:
    ns = f"ws{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "stopper")
    # 20 ms a step: 1000 tokens would run for 20 s
    body = {"model": "echo", "prompt": "a b c", "max_tokens": 1000, "stream": True}
    events: list[str] = []
    with spawn_all(redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []),
                   ("worker", ["--echo-step-ms", "20", "--drain-timeout", "0"])) as (gw, worker):
        with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for line in lines:
                events += [line] if line else []
                if len(events) >= 5:  # tokens streamed: this request cannot run again
                    break
            worker.popen.send_signal(signal.SIGTERM)
            sent_at = time.monotonic()
            events += [line for line in lines if line]
        # No other worker exists to reclaim it: without the stop's own end the stream would
        # wait for its deadline (minutes), so a generous bound still tells the two apart.
        assert time.monotonic() - sent_at < 10.0
        assert worker.popen.wait(10) == 0
        worker._reader.join(5)
        wait_clean(redis_url, ns, timeout=5)
    output = "".join(worker.lines)
    assert "Traceback" not in output, output
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "worker_lost", error
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert len(chunks) >= 5 and all(c["choices"][0]["finish_reason"] is None for c in chunks)
