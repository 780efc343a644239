"""A gateway process's stop, as its requests see it (``carpool serve`` drives it, see
``cli/serve.py``'s ``GatewayServer``):

  begin()         the server stops taking requests: from now on ``ShutdownGate`` answers every
                  new one 503 with Retry-After (uvicorn has closed its listening socket too; the
                  gate covers requests already read on open connections). The ones in flight
                  go on: the graceful period is theirs to finish in.
  end_inflight()  the graceful period is nearly over: every relay still open is ended. Its
                  request is cancelled end to end (the worker aborts it in the engine, its KV
                  blocks are freed, its quota settled) and its client gets an answer, not a cut
                  connection: a stream ends with a ``server_shutdown`` error event and
                  ``data: [DONE]``, a response not yet started is a 503 with Retry-After.
                  A relay that starts after this ends at once, the same way.

Without it uvicorn cancelled the relays left at the end of its graceful period: each printed
"Exception in ASGI application" with a traceback and its client saw a reset connection.
"""

from __future__ import annotations

from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.errors import error_response, server_shutting_down

# answered while stopping: liveness (the process is still alive) and the metrics scrape
UNGATED_PATHS = frozenset({"/healthz", "/metrics"})
# and what acts on a request already admitted: its status, and its cancel (a client that
# gives up during the graceful period frees its KV blocks at once instead of at its end)
_REQUEST_PREFIX = "/v1/requests/"


def gated(method: str, path: str) -> bool:
    """Whether a stopping server refuses this request (503 + Retry-After)."""
    if path in UNGATED_PATHS:
        return False
    if path.startswith(_REQUEST_PREFIX):
        rest = path[len(_REQUEST_PREFIX):].split("/")
        if len(rest) == 1 and method == "GET":
            return False
        if len(rest) == 2 and rest[1] == "cancel" and method == "POST":
            return False
    return True


class Endable(Protocol):
    def end_for_shutdown(self) -> None:
        """Stop relaying and answer the client that the server is shutting down."""

    def end_if_waiting(self) -> bool:
        """End with a 503 if no output has come yet (a data loss, ``recovery.py``)."""


class Shutdown:
    """The process's shutdown state and its open relays (one per process, on ``Services``)."""

    def __init__(self) -> None:
        self.begun = False
        self.ending = False
        self._open: set[Endable] = set()

    def begin(self) -> None:
        self.begun = True

    def track(self, relay: Endable) -> None:
        self._open.add(relay)
        if self.ending:  # admitted while the others were being ended: end it too
            relay.end_for_shutdown()

    def untrack(self, relay: Endable) -> None:
        self._open.discard(relay)

    def open_relays(self) -> list[Endable]:
        """The relays open now (``http/recovery.py`` ends those a data loss stranded)."""
        return list(self._open)

    def end_inflight(self) -> int:
        """End every open relay (each finishes on its own task); returns how many. Again
        later, it ends what was left open since (none, once every relay has untracked)."""
        self.begun = self.ending = True
        relays = list(self._open)
        for relay in relays:
            relay.end_for_shutdown()
        return len(relays)


class ShutdownGate:
    """Pure-ASGI middleware: 503 + Retry-After for every new request once shutdown has
    begun, except those ``gated`` lets through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and gated(scope["method"], scope["path"]):
            services = getattr(scope["app"].state, "services", None)
            if services is not None and services.shutdown.begun:
                await error_response(server_shutting_down())(scope, receive, send)
                return
        await self.app(scope, receive, send)
