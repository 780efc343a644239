"""Unknown paths: a 404 with an OpenAI-style body, before authentication.

A path no route serves gets 404 whether or not the request carries a key (OpenAI and vLLM
answer so; a client probing routes must not read "401, fix your key" for "no such route").
Matching is by path only: a known path with the wrong method still goes through auth and
gets Starlette's 405. Pure ASGI, placed in front of the auth middleware.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.errors import APIError, error_response


class NotFoundMiddleware:
    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._known(scope):
            err = APIError(404, f"Unknown path {scope['path']!r}", code="not_found")
            await error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _known(self, scope: Scope) -> bool:
        # PARTIAL: the path matches but not the method (405 from the router, after auth)
        return any(route.matches(scope)[0] != Match.NONE for route in self.routes)
