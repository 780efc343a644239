"""Slow or idle connections: sockets that send their request headers a byte at a time (or
nothing) are closed by the server once the header timeout has passed, while a normal
request is served meanwhile; past the connection cap a new connection is answered at once
with a 503 (OpenAI-style body, Retry-After) and closed (echo engine)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.faults.table import FaultRow
from tests.gateway.harness import make_config, make_tenant, run_gateway

pytestmark = pytest.mark.timeout(90)
HEADER_TIMEOUT_S = 2.0
SLOW_SOCKETS = 300


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Dribbler(threading.Thread):
    """Sends one more header byte on every socket twice a second, until stopped."""

    def __init__(self, socks: list[socket.socket]) -> None:
        super().__init__(daemon=True)
        self.socks, self.stop = socks, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for sock in self.socks:
                try:
                    sock.send(b"x")
                except OSError:
                    pass


def test_slowloris_sockets_are_closed_and_normal_requests_served(
        redis_url: str, tiny_model_dir: Path, fault_rows: list[FaultRow]) -> None:
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=1.0,
                         header_timeout_s=HEADER_TIMEOUT_S)
    row = FaultRow(f"slowloris: {SLOW_SOCKETS} sockets, header timeout {HEADER_TIMEOUT_S:g} s")
    with run_gateway(config, redis_url) as gw:
        key = make_tenant(redis_url, config.namespace, "slow")
        socks = []
        for i in range(SLOW_SOCKETS):
            sock = socket.create_connection(("127.0.0.1", config.port))
            if i % 2:  # half send a request line and start on headers, half send nothing
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nx-slow: ")
            sock.setblocking(False)
            socks.append(sock)
        opened = time.monotonic()
        dribbler = Dribbler(socks)
        dribbler.start()
        try:
            with httpx.Client(base_url=gw.url, timeout=10,
                              headers={"Authorization": f"Bearer {key}"}) as client:
                while time.monotonic() - opened < HEADER_TIMEOUT_S:
                    r = client.post("/v1/completions", json={
                        "model": "echo", "prompt": "hi there", "max_tokens": 4})
                    row.record(r.status_code, r.json())
            deadline = opened + HEADER_TIMEOUT_S + 10
            open_socks = list(socks)
            while open_socks and time.monotonic() < deadline:
                open_socks = [s for s in open_socks if not closed_by_peer(s)]
                time.sleep(0.1)
            row.recovery_s = time.monotonic() - opened  # until the last one was closed
        finally:
            dribbler.stop.set()
            dribbler.join(5)
            for sock in socks:
                sock.close()
    fault_rows.append(row)
    assert not open_socks, f"{len(open_socks)} slow sockets still open"
    assert row.requests > 0 and row.completed == row.requests


def test_past_the_connection_cap_a_connection_gets_a_clean_503(
        redis_url: str, tiny_model_dir: Path) -> None:
    cap = 20
    config = make_config(engine="echo", model=str(tiny_model_dir), max_connections=cap)
    with run_gateway(config, redis_url) as gw:
        held = [socket.create_connection(("127.0.0.1", config.port)) for _ in range(cap)]
        try:
            time.sleep(0.2)  # the server has accepted them all
            extra = socket.create_connection(("127.0.0.1", config.port))
            extra.settimeout(5)
            reply = b""
            while chunk := extra.recv(4096):  # the server closes it after the answer
                reply += chunk
            extra.close()
        finally:
            for sock in held:
                sock.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503")
        assert b"retry-after: " in head.lower()
        err: Any = json.loads(body)["error"]
        assert err["code"] == "too_many_connections" and err["type"] == "server_error"
        time.sleep(0.2)  # the held connections are gone: served again
        assert httpx.get(gw.url + "/healthz", timeout=5).status_code == 200
