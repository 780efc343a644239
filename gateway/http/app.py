"""The Starlette app, assembled explicitly: routes, pure-ASGI middleware (the shutdown gate,
then auth), error handlers, and a lifespan that creates the Redis client, the services and
(``--role all``) the engine and its worker, all kept on ``app.state``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.protocol import EngineClient
from gateway.bus.client import redis_client
from gateway.config import GatewayConfig
from gateway.http.admin import ADMIN_ROUTES
from gateway.http.auth import AuthMiddleware
from gateway.http.backend import BackendErrors
from gateway.http.errors import APIError, error_response
from gateway.http.not_found import NotFoundMiddleware
from gateway.http.openai import routes as api
from gateway.http.recovery import DataLossWatch, restore
from gateway.http.services import Services
from gateway.http.shutdown import ShutdownGate
from gateway.http.usage import USAGE_ROUTES
from gateway.model_info import ModelInfo, load_model_info
from gateway.process import startup_objects_frozen
from gateway.telemetry.events import GatewayEvents
from gateway.telemetry.gateway_events import events_for
from gateway.telemetry.telemetry import metrics_endpoint
from gateway.tenancy.tenants import TenantStore, load_tenants_file
from gateway.worker.engine_factory import build_engine
from gateway.worker.worker import Worker

ROUTES = [  # matched in order: the completions, on every request's path, first
    Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
    Route("/v1/completions", api.completions, methods=["POST"]),
    Route("/healthz", api.healthz, methods=["GET"]),
    Route("/health", api.healthz, methods=["GET"]),  # what vLLM serves (guidellm's first call)
    Route("/readyz", api.readyz, methods=["GET"]),
    Route("/metrics", metrics_endpoint, methods=["GET"]),
    Route("/v1/models", api.list_models, methods=["GET"]),
    Route("/v1/requests/{request_id}", api.get_request, methods=["GET"]),
    Route("/v1/requests/{request_id}/cancel", api.cancel_request, methods=["POST"]),
    *USAGE_ROUTES,
    *ADMIN_ROUTES,
]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(APIError(exc.status_code, str(exc.detail)))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(APIError(500, "internal server error", code="internal_error"))


async def load_tenants(store: TenantStore, path: str) -> int:
    tenants = load_tenants_file(path)
    for tenant in tenants:
        await store.put(tenant)
    return len(tenants)


def create_app(config: GatewayConfig, redis_url: str, secret: bytes, *,
               engine: EngineClient | None = None, model: ModelInfo | None = None,
               events: GatewayEvents | None = None, freeze_gc: bool = False,
               worker_type: type[Worker] = Worker) -> Starlette:
    """The gateway app. With ``config.role == "all"`` it also runs a worker driving ``engine``
    (built from the config when not given); with ``"gateway"`` it only serves HTTP.
    ``worker_type``: the worker's class (tests run a subclass that can hold its drainer).
    ``freeze_gc``: ``startup_objects_frozen()`` once started (``carpool serve``; tests that
    start many apps in one process leave it off)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        redis = redis_client(redis_url)
        eng = engine
        if config.role == "all" and eng is None:
            eng = await asyncio.to_thread(build_engine, config, model)
        info: ModelInfo
        if eng is not None:  # the engine's own limits win (e.g. a capped max_model_len)
            info = ModelInfo.from_engine(eng)
        elif model is not None:
            info = model
        else:
            info = await asyncio.to_thread(load_model_info, config)
        svc = Services.create(config, redis, secret, info, events or events_for(
            config.role, config),
            engine=eng if config.role == "all" else None, worker_type=worker_type)
        await restore(svc.store, config)  # the tenants file and the admin key
        # reloaded by the watch too, whenever Redis comes back without its data
        watch = DataLossWatch(redis, svc.keys, svc.store, config, svc.shutdown.open_relays)
        await svc.start()
        await watch.start()
        app.state.services = svc
        app.state.data_loss_watch = watch
        app.state.telemetry = getattr(svc.events, "telemetry", None)
        with startup_objects_frozen() if freeze_gc else contextlib.nullcontext():
            try:
                yield
            finally:
                await watch.stop()
                await svc.stop()  # every loop stops before the engine and the client close
                if eng is not None and engine is None:
                    await eng.shutdown()
                await redis.aclose()

    return Starlette(
        routes=ROUTES,
        # the gate first: a stopping server refuses before any auth lookup; an unknown path
        # is a 404 before auth too
        middleware=[Middleware(ShutdownGate), Middleware(NotFoundMiddleware, routes=ROUTES),
                    # Redis errors (the auth lookup's too) become 503s, never 500s
                    Middleware(BackendErrors), Middleware(AuthMiddleware)],
        exception_handlers={APIError: _api_error, HTTPException: _http_error,
                            Exception: _server_error},
        lifespan=lifespan,
    )
