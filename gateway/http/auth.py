"""Authentication and its cache. The pure-ASGI middleware (not BaseHTTPMiddleware, which
buffers and breaks streaming and disconnect detection) resolves ``Authorization: Bearer <key>``
to a tenant through ``AuthCache`` and puts it in ``scope["state"]["tenant"]``; ``/admin/*``
and a ``/console`` request that carries a key require an admin key. The key itself is never
logged or stored; failures are OpenAI-style 401/403 bodies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.errors import APIError, error_response
from gateway.telemetry.events import GatewayEvents
from gateway.tenancy.key_info import KeyLookup
from gateway.tenancy.keys import key_digest, key_id, looks_like_key
from gateway.tenancy.tenants import Tenant, TenantStore

PUBLIC_PATHS = frozenset({"/healthz", "/health", "/readyz", "/metrics"})  # metrics: for the scraper
# The operator console's page and script: a shell holding no data, served to a browser that
# cannot send a header yet (its data comes from /admin/stats with the admin key). A request
# that does present a key here must present an admin one.
CONSOLE_PREFIX = "/console"
EXPIRED = "expired"  # ``AuthCache.resolve``'s key id for an expired key
READ_METHODS = frozenset({"GET", "HEAD"})  # all a read-only admin key may do


@dataclass
class AuthCache:
    """Short-lived caches of key -> tenant id and tenant id -> Tenant, so the hot path costs no
    Redis round trip; entries live ``ttl_s`` (< 1 s), which bounds how long a revoked key or a
    changed quota goes unnoticed. Indexed by the key's HMAC, never by the key."""

    store: TenantStore
    secret: bytes
    ttl_s: float
    _keys: dict[str, tuple[float, KeyLookup | None]] = field(default_factory=dict)
    _tenants: dict[str, tuple[float, Tenant | None]] = field(default_factory=dict)

    async def tenant_for_key(self, key: str) -> Tenant | None:
        return (await self.resolve(key))[0]

    async def resolve(self, key: str) -> tuple[Tenant | None, str]:
        """The key's tenant (None: unknown or revoked), and its key id; the id is
        ``EXPIRED`` for a key past its expiry (checked on every call, against the cached
        expiry: an expiry set by a rotation is seen within the cache time)."""
        if not looks_like_key(key):
            return None, ""
        now = time.monotonic()
        digest = key_digest(self.secret, key)
        hit = self._keys.get(digest)
        if hit is None or hit[0] < now:
            found = await self.store.lookup_key(key)
            if len(self._keys) > 100_000:
                self._keys.clear()
            self._keys[digest] = hit = (now + self.ttl_s, found)
        found = hit[1]
        if found is None:
            return None, key_id(digest)
        if found.expired(time.time()):
            return None, EXPIRED
        return await self.tenant(found.tenant), key_id(digest)

    async def tenant(self, tenant_id: str) -> Tenant | None:
        now = time.monotonic()
        hit = self._tenants.get(tenant_id)
        if hit is None or hit[0] < now:
            hit = (now + self.ttl_s, await self.store.get(tenant_id))
            self._tenants[tenant_id] = hit
        return hit[1]


def bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class AuthServices(Protocol):
    """What the middleware reads of ``app.state.services`` (``gateway.http.services.Services``,
    which holds the ``AuthCache`` above)."""

    @property
    def store(self) -> TenantStore: ...
    @property
    def auth(self) -> AuthCache: ...
    @property
    def events(self) -> GatewayEvents: ...


class AuthMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        services: AuthServices = scope["app"].state.services
        key = bearer_key(scope)
        console = scope["path"].startswith(CONSOLE_PREFIX)
        if console and key is None:
            await self.app(scope, receive, send)
            return
        err: APIError | None = None
        if key is None:
            err = APIError(401, "Missing API key: send 'Authorization: Bearer cp-...'",
                           code="missing_api_key")
        elif scope["path"].startswith("/admin") or console:
            role = await services.store.admin_role(key)
            if role is None:
                err = APIError(401, "An admin key is required", code="invalid_admin_key")
            elif role == "read" and scope["method"] not in READ_METHODS:
                err = APIError(403, "This admin key is read-only", code="admin_key_read_only")
            else:
                scope.setdefault("state", {})["admin_key_id"] = key_id(
                    key_digest(services.auth.secret, key))
        else:
            tenant, kid = await services.auth.resolve(key)
            if kid == EXPIRED:
                err = APIError(401, "This API key has expired", code="key_expired")
            elif tenant is None:
                err = APIError(401, "Invalid or revoked API key", code="invalid_api_key")
            else:
                state = scope.setdefault("state", {})
                state["tenant"], state["key_id"] = tenant, kid
        if err is not None:
            services.events.request_rejected(None, err.status, err.code or "auth")
            await error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)
