"""Separate processes against one Redis (``--role gateway`` / ``--role worker``): the
concurrency cap holds across two gateways, and a worker killed mid-run loses no request:
each completes or ends with a clear error event, none hangs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.bus.keys import RedisKeys
from policies.tiers import TIERS
from tests.gateway.harness import make_tenant, redis_sync
from tests.gateway.procs import spawn_all
from tests.gateway.queue_helpers import pending

pytestmark = pytest.mark.timeout(180)


def test_concurrency_cap_across_two_gateways(redis_url: str, tiny_model_dir: Path,
                                             tmp_path: Path) -> None:
    ns = f"mp{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "capped", max_concurrency=3)
    with contextlib.ExitStack() as stack:
        *gws, _ = stack.enter_context(spawn_all(
            redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []), ("gateway", []),
            ("worker", ["--echo-step-ms", "20"])))
        peak, stop = [0], threading.Event()

        def watch() -> None:
            r = redis_sync(redis_url)
            while not stop.is_set():
                peak[0] = max(peak[0], r.zcard(RedisKeys(ns).concurrency("capped")))
                time.sleep(0.005)
            r.close()

        watcher = threading.Thread(target=watch)
        watcher.start()

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60,
                                         headers={"Authorization": f"Bearer {key}"}) as c:
                body = {"model": "echo", "prompt": "a b", "max_tokens": 50}  # ~1 s each
                return list(await asyncio.gather(*(
                    c.post(gws[i % 2].url + "/v1/completions", json=body) for i in range(12))))

        try:
            res = asyncio.run(fire())
        finally:
            stop.set()
            watcher.join()
    codes = [r.status_code for r in res]
    assert codes.count(200) == 3, codes
    assert peak[0] <= 3
    for r in res:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "concurrency" and r.headers["retry-after"]
    assert {r.json()["usage"]["completion_tokens"] for r in res if r.status_code == 200} == {50}


async def _stream(client: httpx.AsyncClient, url: str, i: int) -> tuple[str, int]:
    """Returns ("done", completion tokens), ("error", text events) or ("eof", text events)
    when the stream ended without [DONE]; hangs are caught by the caller. Tokens are counted
    from the usage chunk: under load the writer coalesces steps, so one event may carry
    several tokens."""
    body = {"model": "echo", "prompt": f"request {i} " * 3, "max_tokens": 60, "stream": True,
            "stream_options": {"include_usage": True}}
    events = 0
    usage_tokens: int | None = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                assert events > 0 and usage_tokens is not None
                return "done", usage_tokens
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    assert event["error"]["message"], event
                    return "error", events
                if event.get("usage"):
                    usage_tokens = event["usage"]["completion_tokens"]
                if event["choices"] and event["choices"][0]["text"]:
                    events += 1
    return "eof", events


def test_worker_killed_mid_run(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    ns = f"mp{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "t")
    with contextlib.ExitStack() as stack:
        gw, doomed, _ = stack.enter_context(spawn_all(
            redis_url, ns, tiny_model_dir, tmp_path, ("gateway", []),
            ("worker", ["--echo-step-ms", "30"]), ("worker", ["--echo-step-ms", "30"])))

        async def run_all() -> list[tuple[str, int]]:
            async with httpx.AsyncClient(timeout=60,
                                         headers={"Authorization": f"Bearer {key}"}) as c:
                tasks = [asyncio.create_task(_stream(c, gw.url, i)) for i in range(12)]
                await asyncio.sleep(0.8)  # every request running (60 x 30 ms = 1.8 s each)
                doomed.popen.kill()  # SIGKILL: no goodbye, its entries stay pending
                return list(await asyncio.wait_for(asyncio.gather(*tasks), 30))

        results = asyncio.run(run_all())
    outcomes = [o for o, _ in results]
    # the killed worker's requests mid-generation resume on the other one (request
    # migration, ``gateway/worker/recovery.py``): every stream ends whole, none with an error
    assert outcomes == ["done"] * 12, results
    assert all(n == 60 for _, n in results), results
    r = redis_sync(redis_url)
    try:
        keys = RedisKeys(ns)
        deadline = time.monotonic() + 10
        while any(pending(r, keys, t) for t in TIERS):
            assert time.monotonic() < deadline, "pending entries left behind"
            time.sleep(0.1)
    finally:
        r.close()
