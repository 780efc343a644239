"""The shared objects one gateway process uses, created in the app's lifespan."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.bus.keys import RedisKeys
from gateway.config import GatewayConfig
from gateway.http.cancel import Canceller
from gateway.http.output_mux import OutputMux
from gateway.model_info import ModelInfo
from gateway.telemetry.events import GatewayEvents
from gateway.tenancy.keys import key_digest, looks_like_key
from gateway.tenancy.quota import QuotaEnforcer
from gateway.tenancy.tenants import Tenant, TenantStore


@dataclass
class AuthCache:
    """Short-lived caches of key -> tenant id and tenant id -> Tenant, so the hot path costs no
    Redis round trip; entries live ``ttl_s`` (< 1 s), which bounds how long a revoked key or a
    changed quota goes unnoticed. Indexed by the key's HMAC, never by the key."""

    store: TenantStore
    secret: bytes
    ttl_s: float
    _keys: dict[str, tuple[float, str | None]] = field(default_factory=dict)
    _tenants: dict[str, tuple[float, Tenant | None]] = field(default_factory=dict)

    async def tenant_for_key(self, key: str) -> Tenant | None:
        if not looks_like_key(key):
            return None
        now = time.monotonic()
        digest = key_digest(self.secret, key)
        hit = self._keys.get(digest)
        if hit is None or hit[0] < now:
            tid = await self.store.resolve_key(key)
            if len(self._keys) > 100_000:
                self._keys.clear()
            self._keys[digest] = hit = (now + self.ttl_s, tid)
        return await self.tenant(hit[1]) if hit[1] is not None else None

    async def tenant(self, tenant_id: str) -> Tenant | None:
        now = time.monotonic()
        hit = self._tenants.get(tenant_id)
        if hit is None or hit[0] < now:
            hit = (now + self.ttl_s, await self.store.get(tenant_id))
            self._tenants[tenant_id] = hit
        return hit[1]


@dataclass
class Services:
    config: GatewayConfig
    redis: Any
    keys: RedisKeys
    store: TenantStore
    auth: AuthCache
    quota: QuotaEnforcer
    canceller: Canceller
    model: ModelInfo
    events: GatewayEvents
    mux: Any = None  # OutputMux: the one reader of every in-flight output stream
    engine: Any = None  # set when this process also runs a worker
    worker: Any = None

    @classmethod
    def create(cls, config: GatewayConfig, redis: Any, secret: bytes, model: ModelInfo,
               events: GatewayEvents) -> Services:
        keys = RedisKeys(config.namespace)
        store = TenantStore(redis, keys, secret)
        lease_ms = int((config.request_timeout_s + 60) * 1000)
        req_ttl = int(config.request_timeout_s + config.stream_ttl_s)
        return cls(
            config=config, redis=redis, keys=keys, store=store,
            auth=AuthCache(store, secret, config.auth_cache_s),
            quota=QuotaEnforcer(redis, keys, config.queue_max_len, lease_ms, req_ttl),
            canceller=Canceller(redis, keys, config.stream_ttl_s),
            model=model, events=events, mux=OutputMux(redis),
        )
