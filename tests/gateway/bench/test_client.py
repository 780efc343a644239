"""The bench's lean HTTP client reads what the gateway really sends: JSON bodies with a length,
chunked SSE streams, error statuses; and it reuses its keep-alive connection (real uvicorn +
gateway on the FAKE echo engine, compared with httpx as the reference client)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.bench.client import BenchHTTPError, LeanClient
from gateway.bench.load import usage_tokens
from tests.gateway.harness import make_tenant

pytestmark = pytest.mark.timeout(60)

BODY = {"model": "echo", "prompt": "The quick brown fox", "max_tokens": 5}


def _lean(gw: Any, key: str) -> LeanClient:
    return LeanClient("127.0.0.1", gw.config.port, {"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def key(echo_gateway: Any, redis_url: str) -> str:
    return make_tenant(redis_url, echo_gateway.config.namespace, "bench-a")


async def test_json_and_sse_bodies_match_httpx(echo_gateway: Any, key: str) -> None:
    client = _lean(echo_gateway, key)
    try:
        full = (await client.post_json("/v1/completions", BODY)).json()
        streamed = (await client.post_json("/v1/completions", {
            **BODY, "stream": True, "stream_options": {"include_usage": True}})).body.decode()
        health = await client.get("/healthz")
        assert len(client._idle) == 1  # one keep-alive connection served all three
    finally:
        await client.aclose()
    async with httpx.AsyncClient(base_url=echo_gateway.url,
                                 headers={"Authorization": f"Bearer {key}"}) as ref:
        expected = (await ref.post("/v1/completions", json=BODY)).json()
    assert full["choices"][0]["text"] == expected["choices"][0]["text"]
    assert full["usage"] == expected["usage"] and full["usage"]["completion_tokens"] == 5
    assert streamed.endswith("data: [DONE]\n\n")
    events = [json.loads(line[6:]) for line in streamed.splitlines()
              if line.startswith("data: {")]
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == expected["choices"][0]["text"]
    assert usage_tokens(streamed) == 5
    assert health.json() == {"status": "ok"}


async def test_error_status_raises(echo_gateway: Any) -> None:
    client = _lean(echo_gateway, "cp-not-a-real-key")
    try:
        with pytest.raises(BenchHTTPError, match="HTTP 401"):
            await client.post_json("/v1/completions", BODY)
    finally:
        await client.aclose()


async def test_stale_keep_alive_connection_is_retried_once() -> None:
    """A server that closes each connection after one answer (as uvicorn does to idle ones)
    without saying so: the next request on the pooled connection gets EOF, and is sent again
    on a new connection."""
    import asyncio

    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = LeanClient("127.0.0.1", port)
    try:
        assert (await client.get("/a")).body == b"ok"
        await asyncio.sleep(0.05)  # the server has closed the pooled connection by now
        assert (await client.get("/b")).body == b"ok"
        assert len(served) == 2
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
