"""``carpool serve``: Redis (embedded unless ``REDIS_URL``), first-run set-up, then the process's
role: ``all`` (HTTP + worker + engine), ``gateway`` (HTTP only) or ``worker`` (no HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

from gateway.bus.embedded import EmbeddedRedis
from gateway.bus.keys import RedisKeys
from gateway.config import GatewayConfig
from gateway.tenancy.keys import generate_key, resolve_secret
from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore

DEMO_TENANT = Tenant("demo", "Demo tenant", TenantQuota(
    rpm=600, tpm=200_000, max_concurrency=32, max_prompt_tokens=4096, max_max_tokens=1024))


def runtime_url_file(config: GatewayConfig) -> Path:
    """Where a serving process leaves its embedded Redis URL for ``carpool tenants``."""
    return Path(config.state_dir) / f"{config.namespace}.redis_url"


async def bootstrap(config: GatewayConfig, redis_url: str, secret: bytes) -> dict[str, str]:
    """Load the tenants file; make an admin key and a demo tenant on a fresh Redis.
    Returns the new secrets to show once (never logged)."""
    from gateway.http.app import load_tenants, redis_client

    redis = redis_client(redis_url)
    shown: dict[str, str] = {}
    try:
        store = TenantStore(redis, RedisKeys(config.namespace), secret)
        if config.tenants_file:
            await load_tenants(store, config.tenants_file)
        if config.admin_key:
            await store.add_admin_key(config.admin_key)
        elif not await store.has_admin_key():
            shown["admin_key"] = generate_key(admin=True)
            await store.add_admin_key(shown["admin_key"])
        if config.create_demo_tenant and not await store.list():
            await store.put(DEMO_TENANT)
            shown["demo_key"], _ = await store.issue_key(DEMO_TENANT.id)
    finally:
        await redis.aclose()
    return shown


def print_welcome(config: GatewayConfig, shown: dict[str, str], model_name: str) -> None:
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    base = f"http://{host}:{config.port}"
    out = sys.stdout
    if "admin_key" in shown:
        out.write(f"\nAdmin key (shown once): {shown['admin_key']}\n")
    if "demo_key" in shown:
        out.write(f"Demo tenant 'demo' key (shown once): {shown['demo_key']}\n\nTry:\n"
                  f"  curl {base}/v1/chat/completions \\\n"
                  f"    -H 'Authorization: Bearer {shown['demo_key']}' "
                  f"-H 'Content-Type: application/json' \\\n"
                  f"    -d '{{\"model\": \"{model_name}\", \"messages\": [{{\"role\": \"user\", "
                  f"\"content\": \"Hello!\"}}], \"max_tokens\": 32}}'\n\n")
    out.flush()


def served_model_name(config: GatewayConfig) -> str:
    if config.engine == "echo":
        from gateway.model_info import ECHO_MODEL_NAME

        return ECHO_MODEL_NAME
    from engine.runner.loader import model_name, resolve_model_dir

    return model_name(resolve_model_dir(config.model))


def serve(config: GatewayConfig) -> int:
    embedded: EmbeddedRedis | None = None
    redis_url = config.redis_url
    url_file = runtime_url_file(config)
    if redis_url is None:
        _exit_cleanly_on_sigterm()
        embedded = EmbeddedRedis()
        redis_url = embedded.start()
        url_file.parent.mkdir(parents=True, exist_ok=True)
        url_file.write_text(redis_url)
        print(f"embedded Redis at {redis_url} (stopped on exit)", flush=True)
    try:
        secret = resolve_secret(config.secret, config.state_dir)
        if config.role != "worker":
            shown = asyncio.run(bootstrap(config, redis_url, secret))
            print_welcome(config, shown, served_model_name(config))
        if config.role == "worker":
            run_loop(run_worker(config, redis_url, secret))
        else:
            run_http(config, redis_url, secret)
    finally:
        if embedded is not None:
            with contextlib.suppress(OSError):
                url_file.unlink()
            embedded.stop()
    return 0


def run_loop(coro: Any) -> Any:
    """Run ``coro`` on uvloop when installed, as uvicorn does for the HTTP roles: a worker
    process's loop carries the per-step writes, and asyncio's own timers overshoot by up to a
    millisecond whenever the loop waits on a socket (measured in ``carpool bench gateway``)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM -> SystemExit, so ``finally`` and atexit stop the embedded Redis. uvicorn
    re-raises the SIGTERM it caught once its graceful shutdown is done; under the default
    action the process died right there and left the server running."""

    def handler(_signum: int, _frame: object) -> None:
        raise SystemExit(0)  # a requested stop that completed

    signal.signal(signal.SIGTERM, handler)


def run_http(config: GatewayConfig, redis_url: str, secret: bytes) -> None:
    import uvicorn

    from gateway.http.app import create_app

    app = create_app(config, redis_url, secret, freeze_gc=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="info",
                access_log=config.access_log, timeout_graceful_shutdown=5)


async def run_worker(config: GatewayConfig, redis_url: str, secret: bytes) -> None:
    """A worker process: no HTTP, just the drainer/engine loop until SIGTERM/SIGINT."""
    from gateway.http.app import redis_client, startup_objects_frozen
    from gateway.model_info import build_engine
    from gateway.telemetry.gateway_events import events_for
    from gateway.worker.worker import Worker

    redis = redis_client(redis_url)
    engine: Any = await asyncio.to_thread(build_engine, config)
    events = events_for("worker", trace_console=config.trace_console)
    worker = Worker(redis, engine, config, events)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    await events.start(worker)
    if config.metrics_port:
        events.telemetry.serve_metrics(config.metrics_port, config.host)
    print(f"worker {worker.consumer} ready", flush=True)
    with startup_objects_frozen():
        try:
            await stop.wait()
        finally:
            await worker.stop()
            await events.stop()
            await engine.shutdown()
            await redis.aclose()
