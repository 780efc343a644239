"""Test harness: a real uvicorn server on a free loopback port in a background thread, serving
the real gateway app against the session's embedded Redis; tenants and keys made directly in
Redis through the same ``TenantStore`` the gateway uses."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis as sync_redis
import uvicorn

from gateway.bus.keys import RedisKeys
from gateway.config import GatewayConfig
from gateway.http.app import create_app
from gateway.http.conn_limits import uvicorn_limits
from gateway.process import free_port
from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore

SECRET = b"test-secret-0123456789abcdef"


def make_config(**overrides: Any) -> GatewayConfig:
    values: dict[str, Any] = {
        "namespace": f"t{uuid.uuid4().hex[:10]}", "engine": "echo", "port": free_port(),
        "request_timeout_s": 60.0, "stall_timeout_s": 10.0, "visibility_timeout_s": 5.0,
        "create_demo_tenant": False, "state_dir": "/nonexistent",
    }
    values.update(overrides)
    return GatewayConfig(**values)


class RunningGateway:
    def __init__(self, server: uvicorn.Server, app: Any, config: GatewayConfig,
                 thread: threading.Thread) -> None:
        self.server, self.app, self.config, self.thread = server, app, config, thread
        self.url = f"http://127.0.0.1:{config.port}"

    @property
    def services(self) -> Any:
        return self.app.state.services

    @property
    def engine(self) -> Any:
        return self.services.engine

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the server's loop (for engine/worker inspection)."""
        loop = self.server_loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


@contextmanager
def run_gateway(config: GatewayConfig, redis_url: str, **app_kwargs: Any) -> Iterator[RunningGateway]:
    app = create_app(config, redis_url, SECRET, **app_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.port,
                                           log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=2,
                                           # as ``carpool serve``: header timeout, connection
                                           # cap, small send buffers
                                           **uvicorn_limits(config.header_timeout_s,
                                                            config.max_connections)))
    holder: dict[str, Any] = {}

    def target() -> None:
        loop = asyncio.new_event_loop()
        holder["loop"] = loop
        loop.run_until_complete(server.serve())
        loop.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("gateway did not start")
        time.sleep(0.02)
    gw = RunningGateway(server, app, config, thread)
    gw.server_loop = holder["loop"]  # type: ignore[attr-defined]
    try:
        yield gw
    finally:
        server.should_exit = True
        thread.join(15)


def store_for(redis_url: str, namespace: str) -> tuple[Any, TenantStore]:
    from gateway.bus.client import redis_client

    client = redis_client(redis_url)  # a cluster's too (``?cluster=1``)
    return client, TenantStore(client, RedisKeys(namespace), SECRET)


def make_tenant(redis_url: str, namespace: str, tenant_id: str = "acme",
                **quota: Any) -> str:
    """Create a tenant with ``quota`` and return a fresh API key for it."""

    async def go() -> str:
        client, store = store_for(redis_url, namespace)
        try:
            await store.put(Tenant(tenant_id, tenant_id, TenantQuota(**quota)))
            key, _ = await store.issue_key(tenant_id)
            return key
        finally:
            await client.aclose()

    return asyncio.run(go())


@contextmanager
def openai_client(gateway: RunningGateway, redis_url: str, tenant_id: str,
                  **quota: Any) -> Iterator[Any]:
    """The official openai client for a new tenant ``tenant_id`` (with ``quota``) of a running
    gateway: no retries, so a test sees the first answer."""
    import openai

    key = make_tenant(redis_url, gateway.config.namespace, tenant_id, **quota)
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0,
                       timeout=60) as client:
        yield client


def redis_sync(redis_url: str) -> sync_redis.Redis:
    return sync_redis.Redis.from_url(redis_url)
