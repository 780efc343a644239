"""Connection limits at the HTTP edge: uvicorn's httptools protocol with three additions.

  header timeout   a connection whose request headers are not complete ``header_timeout_s``
                   after it opened (or after its previous response, on a kept-alive one, once
                   the next request's first byte came) is closed: slowloris sockets that
                   send a byte now and then no longer hold a socket and a slot for ever.
  connection cap   past ``max_connections`` open connections in the process, a new one is
                   answered at once with a 503 (OpenAI-style body, ``Retry-After``,
                   ``Connection: close``) and closed, before it can send anything; uvicorn's
                   own ``limit_concurrency`` answers only once headers are complete, so
                   slowloris sockets would never meet it, and it logs a line per refusal.
  small buffers    the bytes in flight toward one client are bounded: the transport pauses
                   the relay above ``WRITE_HIGH`` bytes and the socket's send buffer is
                   ``SEND_BUFFER`` (no autotuning to megabytes), so a client that stops
                   reading blocks the relay's next write soon after its own receive buffer
                   is full, and the stall timeout starts then (``relay.py``), instead of after
                   the kernel had absorbed ~100 KB-4 MB of output generated for nobody.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http.errors import APIError, error_bytes

WRITE_HIGH = 16 * 1024  # transport buffer above which uvicorn's send waits (drain)
WRITE_LOW = 4 * 1024
SEND_BUFFER = 32 * 1024  # SO_SNDBUF (the kernel doubles it for its bookkeeping)
CAP_RETRY_AFTER_S = 1


def _cap_response() -> bytes:
    body = error_bytes(APIError(503, "too many open connections to this server; retry",
                                code="too_many_connections"))
    head = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            % (CAP_RETRY_AFTER_S, len(body)))
    return head + body


CAP_RESPONSE = _cap_response()


def http_protocol(header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these limits."""

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.refused = True
                transport.write(CAP_RESPONSE)
                transport.close()
                return
            transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self.refused:
                super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:  # the next request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # idle between requests: uvicorn's keep-alive timeout applies

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return LimitedHttpToolsProtocol


def uvicorn_limits(header_timeout_s: float, max_connections: int) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments that apply these limits."""
    return {"http": http_protocol(header_timeout_s, max_connections)}
