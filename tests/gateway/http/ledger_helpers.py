"""Clients that count the completion tokens they received, for the ledger's exactness tests.

The FAKE echo engine echoes the prompt a token per step; a prompt of ``a`` then `` a``
repeated makes every completion token one ``a`` in the text, so a client counts the tokens it
received by counting ``a``s in the text it got, whatever the streaming split.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from gateway.tenancy.ledger import UsageLedger, UsageRow, group_rows, parse_range


def a_prompt(n: int) -> str:
    return "a" + " a" * (n - 1)


def sse_tokens(raw: bytes) -> int:
    """Completion tokens in an SSE body (chat or completions chunks), by their text."""
    n = 0
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        for c in event.get("choices", ()):
            n += (c.get("text") or (c.get("delta") or {}).get("content") or "").count("a")
    return n


def stream_over_http(url: str, key: str, body: dict[str, Any]) -> int:
    """A streamed completion read to its end; the tokens received."""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60) as r:
        return sse_tokens(r.read())


async def cut_stream(app: Any, key: str, body: dict[str, Any], after: int) -> int:
    """A streamed completion whose client leaves once it has ``after`` tokens, through the
    ASGI app itself (on the gateway's loop): what the client received is exactly every body
    the gateway sent, with no socket buffer in between. Returns the tokens received."""
    gone = asyncio.Event()
    first = True
    got: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "more_body": False,
                    "body": json.dumps({**body, "stream": True}).encode()}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            got.append(message.get("body", b""))
            if sse_tokens(b"".join(got)) >= after:
                gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"authorization", f"Bearer {key}".encode()),
                         (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return sse_tokens(b"".join(got))


def ledger_total(gw: Any, tenant: str, requests: int, timeout: float = 20.0) -> UsageRow:
    """The tenant's ledger summed over today, once it counts ``requests`` (settles run
    as each relay ends, just after its client's last byte)."""
    svc = gw.services

    async def read() -> UsageRow | None:
        t0, t1 = parse_range(None, None, time.time() + 3600, default_days=2)
        rows = group_rows(await UsageLedger(svc.redis, svc.keys).read([tenant], t0, t1), "model")
        return rows[0] if rows else None

    deadline = time.monotonic() + timeout
    while True:
        row = gw.call(read())
        if row is not None and row.requests >= requests or time.monotonic() > deadline:
            assert row is not None
            return row
        time.sleep(0.05)
