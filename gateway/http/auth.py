"""Authentication as pure-ASGI middleware (not BaseHTTPMiddleware, which buffers and breaks
streaming and disconnect detection). Resolves ``Authorization: Bearer <key>`` to a tenant and
puts it in ``scope["state"]["tenant"]``; ``/admin/*`` requires an admin key. The key itself is
never logged or stored; failures are OpenAI-style 401/403 bodies.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.errors import APIError, error_response

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # metrics: for the scraper


def bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class AuthMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        services: Any = scope["app"].state.services
        key = bearer_key(scope)
        err: APIError | None = None
        if key is None:
            err = APIError(401, "Missing API key: send 'Authorization: Bearer cp-...'",
                           code="missing_api_key")
        elif scope["path"].startswith("/admin"):
            if not await services.store.is_admin_key(key):
                err = APIError(401, "An admin key is required", code="invalid_admin_key")
        else:
            tenant = await services.auth.tenant_for_key(key)
            if tenant is None:
                err = APIError(401, "Invalid or revoked API key", code="invalid_api_key")
            else:
                scope.setdefault("state", {})["tenant"] = tenant
        if err is not None:
            services.events.request_rejected(None, err.status, err.code or "auth")
            await error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)
