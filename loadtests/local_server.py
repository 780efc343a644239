"""A throw-away Carpool deployment for a load test: embedded Redis, one tenant per tier with its
own key, and the gateway + worker + engine under uvicorn in a background thread. Everything it
starts is stopped when the context exits."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gateway.bus.embedded import EmbeddedRedis
from gateway.config import GatewayConfig
from gateway.process import free_port
from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore
from policies.tiers import TIERS

START_TIMEOUT_S = 300.0  # the first SmolLM2 start converts the GGUF (~15 s); tiny models ~1 s


@dataclass(frozen=True)
class LocalServer:
    url: str
    keys: dict[str, str]  # tier -> API key of that tier's tenant
    app: Any


async def make_tenants(redis_url: str, namespace: str, secret: bytes,
                       rpm: Mapping[str, int]) -> dict[str, str]:
    """One tenant per tier, allowed only that tier (``rpm[tier]``: its requests-per-minute
    limit, 0 = unlimited); returns tier -> a fresh key."""
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys

    client = redis_client(redis_url)
    store = TenantStore(client, RedisKeys(namespace), secret)
    keys = {}
    try:
        for tier in TIERS:
            tid = f"loadtest-{tier}"
            quota = TenantQuota(rpm=int(rpm.get(tier, 0)), allowed_tiers=(tier,),
                                default_tier=tier)
            await store.put(Tenant(tid, f"load test ({tier})", quota))
            keys[tier], _ = await store.issue_key(tid)
    finally:
        await client.aclose()
    return keys


@contextmanager
def local_server(config: GatewayConfig, rpm: Mapping[str, int]) -> Iterator[LocalServer]:
    """Serve ``config`` (its port is replaced by a free one) until the block exits."""
    import uvicorn

    from gateway.http.app import create_app

    redis = EmbeddedRedis()
    redis_url = redis.start()
    try:
        config = config.replace(port=free_port(), redis_url=redis_url,
                                create_demo_tenant=False)
        secret = secrets.token_bytes(32)
        keys = asyncio.run(make_tenants(redis_url, config.namespace, secret, rpm))
        app = create_app(config, redis_url, secret)
        server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=config.port, log_level="warning", lifespan="on",
            access_log=config.access_log, timeout_graceful_shutdown=5))
        thread = threading.Thread(target=server.run, name="carpool-loadtest-server",
                                  daemon=True)
        thread.start()
        try:
            _wait_started(server, thread)
            yield LocalServer(f"http://127.0.0.1:{config.port}", keys, app)
        finally:
            server.should_exit = True
            thread.join(30)
    finally:
        redis.stop()


def _wait_started(server: Any, thread: threading.Thread) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the Carpool server failed to start (see its log above)")
        if time.monotonic() > deadline:
            raise RuntimeError("the Carpool server did not start in time")
        time.sleep(0.05)
