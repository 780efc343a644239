"""Redis unreachable -> 503, never a 500: pure-ASGI middleware around auth and the routes.

Any Redis error that escapes a request's handling (the API-key lookup, admission, the admin
API, a request's status) becomes ``503`` with ``Retry-After`` and the OpenAI-style body
``code: "backend_unavailable"``, if the response has not started yet (a started stream ends
through its relay). The outage is said once in the log (``bus/outage.py``), not per request;
any other Redis error (a script's, a key of the wrong type: a fault to look into, not an
outage) is logged with its traceback once per distinct message.
While it lasts, each request first pings Redis: a failed ping answers 503 at once, and the
first ping that succeeds logs that Redis is back.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.bus.outage import UNREACHABLE, ErrorOnce, OutageLog
from gateway.http.errors import backend_unavailable, error_response

log = logging.getLogger("carpool.gateway")
_errors = ErrorOnce(log)  # never cleared: each distinct error once per process


class BackendErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services = getattr(scope.get("app"), "state", None)
        services = getattr(services, "services", None)
        if scope["type"] != "http" or services is None:
            await self.app(scope, receive, send)
            return
        outage = OutageLog.of(log)
        if outage.down and not await _reachable(services.redis, outage):
            await error_response(backend_unavailable())(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except RedisError as exc:
            if isinstance(exc, UNREACHABLE):
                outage.failed("request", exc)
            else:  # answered 503 all the same, but it must not go unseen
                _errors.failed("a request's Redis call", exc)
            if started:
                raise
            services.events.request_rejected(None, 503, "backend_unavailable")
            await error_response(backend_unavailable())(scope, receive, send)


async def _reachable(redis: Any, outage: OutageLog) -> bool:
    try:
        await redis.ping()
    except RedisError as exc:
        outage.failed("ping", exc)
        return False
    outage.ok()
    return True
