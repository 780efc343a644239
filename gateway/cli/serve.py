"""``carpool serve``: Redis (embedded unless ``REDIS_URL``), first-run set-up, then the process's
role: ``all`` (HTTP + worker + engine), ``gateway`` (HTTP only) or ``worker`` (no HTTP).

A normal stop (Ctrl-C, SIGTERM) exits 0 with no traceback and ends every request:
  HTTP roles  uvicorn stops accepting; the requests in flight get the drain deadline
              (``--drain-timeout``, ``CARPOOL_DRAIN_TIMEOUT_S``) to finish, and new ones
              (``/readyz`` too) a 503 (``http/shutdown.py``); ``END_MARGIN_S`` before uvicorn would
              cancel them, the relays still open cancel their requests end to end and tell
              their clients the server is shutting down (an error event and ``[DONE]``).
  worker      ``Worker.drain``: no new work at once; the requests in flight get the drain
              deadline to finish, then (or at a second SIGTERM) what is left is handed to
              another live worker, which resumes each stream from the tokens already sent;
              with none alive, a stream that had output ends with a worker-lost error.
              Then ``Worker.stop`` and the engine's shutdown; exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.bus.client import check_redis
from gateway.bus.embedded import EmbeddedRedis
from gateway.bus.keys import RedisKeys
from gateway.config import GatewayConfig
from gateway.process import exit_cleanly_on_sigterm, run_loop, startup_objects_frozen, stop_event
from gateway.tenancy.keys import generate_key, resolve_secret
from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore

if TYPE_CHECKING:
    import uvicorn

# the relays still open are ended this long before uvicorn would cancel them: time for each to
# send its last event and to cancel and settle its request (a few Redis round trips)
END_MARGIN_S = 1.0

DEMO_TENANT = Tenant("demo", "Demo tenant", TenantQuota(
    rpm=600, tpm=200_000, max_concurrency=32, max_prompt_tokens=4096, max_max_tokens=1024))


def runtime_url_file(config: GatewayConfig) -> Path:
    """Where a serving process leaves its embedded Redis URL for ``carpool tenants``."""
    return Path(config.state_dir) / f"{config.namespace}.redis_url"


async def bootstrap(config: GatewayConfig, redis_url: str, secret: bytes) -> dict[str, str]:
    """Load the tenants file; make an admin key and a demo tenant on a fresh Redis.
    Returns the new secrets to show once (never logged)."""
    from gateway.bus.client import redis_client
    from gateway.http.app import load_tenants

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
    out.write(f"Console: {base}/console (sign in with the admin key; "
              f"'carpool doctor --url {base}' names batching symptoms)\n")
    out.flush()


def served_model_name(config: GatewayConfig) -> str:
    if config.engine == "echo":
        from gateway.model_info import ECHO_MODEL_NAME

        return ECHO_MODEL_NAME
    from engine.model_files import model_name, resolve_model_dir

    return model_name(resolve_model_dir(config.model))


def show_carpool_logs() -> None:
    """Carpool's own INFO lines on stderr, in uvicorn's format (what the step budget chose as
    interactive's TPOT target is one); without a handler Python shows only warnings."""
    log = logging.getLogger("carpool")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def serve(config: GatewayConfig) -> int:
    show_carpool_logs()
    embedded: EmbeddedRedis | None = None
    redis_url = config.redis_connection_url
    url_file = runtime_url_file(config)
    # Every role: uvicorn re-raises the SIGTERM it handled, and under the default action the
    # process would then die with -SIGTERM after a clean graceful stop.
    exit_cleanly_on_sigterm()
    if redis_url is None:
        embedded = EmbeddedRedis()
        redis_url = embedded.start()
        url_file.parent.mkdir(parents=True, exist_ok=True)
        url_file.write_text(redis_url)
        print(f"embedded Redis at {redis_url} (stopped on exit)", flush=True)
    else:
        check_redis(redis_url)  # a bad certificate or password: one line, not a traceback
    try:
        secret = resolve_secret(config.secret, config.state_dir)
        if config.role == "worker":
            run_loop(run_worker(config, redis_url, secret))
        else:
            # The keys are made now, but shown (with the curl line) only once the server
            # accepts requests: the engine loads for seconds before it listens.
            shown = asyncio.run(bootstrap(config, redis_url, secret))
            name = served_model_name(config)
            run_http(config, redis_url, secret,
                     on_started=lambda: print_welcome(config, shown, name))
    finally:
        # Every loop of this process has stopped by now (uvicorn ran the app's shutdown,
        # run_worker its own): nothing is left to see the server go.
        if embedded is not None:
            with contextlib.suppress(OSError):
                url_file.unlink()
            embedded.stop()
    return 0


def gateway_server(config: uvicorn.Config, on_started: Callable[[], None]) -> uvicorn.Server:
    """A ``uvicorn.Server`` for the gateway app in ``config``: ``on_started`` is called once
    the socket listens and the app's start-up (engine included) has completed; its shutdown
    ends the requests still open before the graceful period runs out (module docstring)."""
    import uvicorn

    class GatewayServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                on_started()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app: Any = self.config.app  # the Starlette app (create_app)
            services = getattr(app.state, "services", None)
            if services is None:  # the app's start-up never completed
                await super().shutdown(sockets)
                return
            services.shutdown.begin()
            grace = self.config.timeout_graceful_shutdown or 0
            timer = asyncio.get_running_loop().call_later(
                max(0.0, grace - END_MARGIN_S), services.shutdown.end_inflight)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return GatewayServer(config)


def run_http(config: GatewayConfig, redis_url: str, secret: bytes,
             on_started: Callable[[], None]) -> None:
    """uvicorn.run with the gateway app, through ``gateway_server``."""
    import uvicorn

    from gateway.http.app import create_app
    from gateway.http.conn_limits import uvicorn_limits

    app = create_app(config, redis_url, secret, freeze_gc=True)
    server = gateway_server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="info",
        access_log=config.access_log,
        timeout_graceful_shutdown=math.ceil(max(END_MARGIN_S + 1, config.drain_timeout_s)),
        # header timeout, connection cap, small send buffers (``http/conn_limits.py``)
        **uvicorn_limits(config.header_timeout_s, config.max_connections)), on_started)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: it re-raises the SIGINT
        server.run()  # it caught, once its graceful shutdown is done
    if not server.started:
        sys.exit(3)  # uvicorn.run's STARTUP_FAILURE: the app's start-up failed (logged)


async def run_worker(config: GatewayConfig, redis_url: str, secret: bytes) -> None:
    """A worker process: no HTTP, just the drainer/engine loop until SIGTERM/SIGINT."""
    from gateway.bus.client import redis_client
    from gateway.telemetry.gateway_events import events_for
    from gateway.worker.engine_factory import build_engine
    from gateway.worker.worker import Worker

    stop = stop_event()
    redis = redis_client(redis_url)
    engine = await asyncio.to_thread(build_engine, config)
    events = events_for("worker", config)
    worker = Worker(redis, engine, config, events)
    await worker.start()
    await events.start(worker)
    if config.metrics_port:
        events.telemetry.serve_metrics(config.metrics_port, config.host)
    print(f"worker {worker.consumer} ready", flush=True)
    with startup_objects_frozen():
        try:
            await stop.wait()
            stop.clear()  # set again by a second SIGTERM/SIGINT: hand off at once
            await worker.drain(config.drain_timeout_s, now=stop)
        finally:
            await worker.stop()
            await events.stop()
            await engine.shutdown()
            await redis.aclose()
