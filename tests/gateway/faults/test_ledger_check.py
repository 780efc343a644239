"""The usage ledger under cut streams and server timeouts, over real sockets: the completion
tokens the ledger records for a tenant equal those its clients received (the ledger check
table; worker death and the Redis restart add their rows in their own tests)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.faults.table import ledger_check
from tests.gateway.harness import make_config, make_tenant, run_gateway
from tests.gateway.http.ledger_helpers import a_prompt, cut_stream, sse_tokens

pytestmark = pytest.mark.timeout(120)
STREAMS = 8


@pytest.fixture(scope="module")
def echo20(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """The FAKE echo engine at 20 ms a step, a 1 s server deadline and a 0.5 s stall
    timeout."""
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=20.0,
                         request_timeout_s=1.0, stall_timeout_s=0.5)
    with run_gateway(config, redis_url) as gw:
        yield gw


def cut_after(url: str, key: str, tokens: int, received: list[int]) -> None:
    """A stream whose client closes the connection once it has read ``tokens`` tokens."""
    body = {"model": "echo", "prompt": a_prompt(60), "max_tokens": 60, "stream": True}
    got = b""
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        for chunk in r.iter_raw():
            got += chunk
            if sse_tokens(got[:got.rfind(b"\n\n") + 2]) >= tokens:
                break
    received.append(sse_tokens(got[:got.rfind(b"\n\n") + 2]))


def test_streams_cut_by_the_client(echo20: Any, redis_url: str) -> None:
    """Through the app itself, what the client received is every body the gateway sent: 0
    drift. Over TCP a client that closes may leave unread what was already in flight to it
    (no server can know): the ledger then counts those too, never fewer than were read."""
    gw, ns = echo20, echo20.config.namespace
    key = make_tenant(redis_url, ns, "cut")
    body = {"model": "echo", "prompt": a_prompt(60), "max_tokens": 60}

    async def cut_all() -> list[int]:
        return list(await asyncio.gather(*(cut_stream(gw.app, key, body, 3 + i)
                                           for i in range(STREAMS))))

    received = gw.call(cut_all())
    row = ledger_check(redis_url, ns, "cut", f"streams cut by the client ({STREAMS} streams, "
                       "20 ms steps; what the gateway sent)", sum(received), STREAMS)
    assert row.drift == 0, row

    key = make_tenant(redis_url, ns, "cut-tcp")
    over_tcp: list[int] = []
    threads = [threading.Thread(target=cut_after, args=(gw.url, key, 3 + i, over_tcp))
               for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(over_tcp) == STREAMS
    row = ledger_check(redis_url, ns, "cut-tcp", f"streams cut by the client over TCP "
                       f"({STREAMS} streams; what the client read before closing)",
                       sum(over_tcp), STREAMS)
    assert row.drift >= 0, row  # in flight when the client closed: sent, never read


def test_server_timeouts(echo20: Any, redis_url: str) -> None:
    gw = echo20
    key = make_tenant(redis_url, gw.config.namespace, "late")
    user = {"Authorization": f"Bearer {key}"}
    long = {"model": "echo", "prompt": a_prompt(100), "max_tokens": 100}
    received = []
    for _ in range(3):  # streamed: the deadline's error event ends each
        with httpx.stream("POST", gw.url + "/v1/completions", headers=user, timeout=30,
                          json={**long, "stream": True}) as r:
            raw = r.read()
        assert b'"code": "timeout"' in raw or b'"code":"timeout"' in raw
        received.append(sse_tokens(raw))
    for _ in range(2):  # whole answers: a 504, no tokens
        r = httpx.post(gw.url + "/v1/completions", headers=user, json=long, timeout=30)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        received.append(0)
    assert all(n > 0 for n in received[:3])
    row = ledger_check(redis_url, gw.config.namespace, "late",
                       "server deadline (1 s; 3 streams, 2 whole answers)", sum(received), 5)
    assert row.drift == 0, row
