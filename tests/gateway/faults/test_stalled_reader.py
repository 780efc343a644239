"""A streaming client that stops reading (a raw socket that reads the response head and a
few bytes, then nothing): with a large output it is cancelled once its receive buffer and
the server's bounded send buffers are full plus the stall timeout, and the engine frees its
KV blocks; with a small output the answer fits in the buffers and simply finishes. Either
way nothing is left running or holding KV blocks once idle (tiny real engine)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.bus.keys import RedisKeys
from tests.gateway.faults.stack import idle_kv_blocks, wait_for
from tests.gateway.faults.table import FaultRow
from tests.gateway.harness import make_config, make_tenant, redis_sync, run_gateway

pytestmark = pytest.mark.timeout(120)
STALL_S = 2.0
CLIENT_RCVBUF = 128 * 1024
ENGINE = {"num_blocks": 160, "block_size": 16, "max_num_seqs": 8, "max_model_len": 2048}


@pytest.fixture(scope="module")
def stack(redis_url: str, tiny_model_dir: Path) -> Iterator[tuple[Any, str]]:
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=ENGINE,
                         stall_timeout_s=STALL_S)
    with run_gateway(config, redis_url) as gw:
        yield gw, make_tenant(redis_url, config.namespace, "stall")


def stalled_stream(gw: Any, key: str, max_tokens: int) -> socket.socket:
    """Send a streaming request on a raw socket, read its head and first bytes, then stop
    reading (the socket stays open)."""
    body = json.dumps({"model": str(gw.engine.model_name), "prompt": "Once upon a time",
                       "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    sock = socket.socket()
    # a receive buffer of a common default size, set so that the test does not depend on
    # this machine's tcp_rmem (the output must outgrow it and the server's bounded buffers)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
    sock.connect(("127.0.0.1", gw.config.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def settled(redis_url: str, ns: str, outcome: str) -> int:
    keys, r = RedisKeys(ns), redis_sync(redis_url)
    return sum(int(r.hget(keys.stats(s), f"settled:{outcome}") or 0) for s in keys.shard_range())


@pytest.mark.parametrize("max_tokens, expect", [(1900, "aborted"), (40, "completed")])
def test_a_client_that_stops_reading(stack: tuple[Any, str], redis_url: str, max_tokens: int,
                                     expect: str, fault_rows: list[FaultRow]) -> None:
    gw, key = stack
    ns = gw.config.namespace
    before = {o: settled(redis_url, ns, o) for o in ("aborted", "completed")}
    row = FaultRow(f"stalled reader, {max_tokens} tokens (stall timeout {STALL_S:g} s)",
                   requests=1)
    sock = stalled_stream(gw, key, max_tokens)
    stopped = time.monotonic()
    try:
        wait_for(lambda: sum(settled(redis_url, ns, o) - before[o] for o in before), 60)
        row.recovery_s = time.monotonic() - stopped  # until it ended (cancelled or finished)
        row.kv_blocks_after_idle = idle_kv_blocks(gw)
    finally:
        sock.close()
    ended = {o: settled(redis_url, ns, o) - before[o] for o in before}
    if expect == "aborted":
        row.clear_errors = ended["aborted"]
    else:
        row.completed = ended["completed"]
    row.codes = {expect: 1}
    fault_rows.append(row)
    assert ended == {o: int(o == expect) for o in before}
    assert row.kv_blocks_after_idle == 0
