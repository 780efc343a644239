"""A lean HTTP/1.1 keep-alive client for ``carpool bench gateway`` (benchmarks only).

The load generator shares the CPUs with the gateway and Redis, so its own cost shows up as
gateway latency. httpx spends ~1 ms of CPU per request in Python; this client speaks just
what the bench needs (keep-alive, ``Content-Length`` and chunked bodies) straight on asyncio
streams, a few tens of microseconds per request. It is not a general HTTP client: no TLS, no
redirects, no compression, and a response must be read to its end before the connection is
reused (which ``request`` always does).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


class BenchHTTPError(Exception):
    """A non-2xx status or a malformed response."""


@dataclass
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


class LeanClient:
    """Keep-alive connections to one ``host:port``; one request per connection at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self._head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[_Conn] = []

    async def aclose(self) -> None:
        while self._idle:
            conn = self._idle.pop()
            conn.writer.close()
            try:
                await conn.writer.wait_closed()
            except OSError:
                pass

    async def get(self, path: str) -> Response:
        return await self.request("GET", path)

    async def post_json(self, path: str, body: Any) -> Response:
        return await self.request("POST", path, json.dumps(body).encode())

    async def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        """Send one request and read the whole response (chunked or not); raise on non-2xx.
        A kept-alive connection the server closed meanwhile (uvicorn drops idle ones after
        5 s) fails before any byte of the answer: the request is sent again, once, on a new
        connection, as httpx does (the server never saw it)."""
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self._head}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = head.encode() + b"\r\n" + (body or b"")
        while self._idle:
            conn = self._idle.pop()
            try:
                return await self._exchange(conn, data)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
        conn = _Conn(*await asyncio.open_connection(self.host, self.port))
        return await self._exchange(conn, data)

    async def _exchange(self, conn: _Conn, data: bytes) -> Response:
        try:
            conn.writer.write(data)
            status, body, keep = await _read_response(conn.reader)
        except BaseException:
            conn.writer.close()
            raise
        if keep:
            self._idle.append(conn)
        else:
            conn.writer.close()
        if not 200 <= status < 300:
            raise BenchHTTPError(f"HTTP {status}: {body[:200]!r}")
        return Response(status, body)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise BenchHTTPError(f"bad status line {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    keep = headers.get("connection", "").lower() != "close"
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return int(parts[1]), await _read_chunked(reader), keep
    length = int(headers.get("content-length", "0"))
    return int(parts[1]), await reader.readexactly(length) if length else b"", keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers from uvicorn: the final CRLF
            return bytes(out)
        out += await reader.readexactly(size + 2)
        del out[-2:]
