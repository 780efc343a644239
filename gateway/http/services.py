"""The shared objects of one gateway process, built once (``Services.create``) in the app's
lifespan and never reassigned: Redis client, tenants and their auth cache, quotas,
cancellation, the output reader (``OutputMux``), the shutdown state and its open relays
(``Shutdown``), and, when the process also runs a worker (``--role all``), the engine and the
worker driving it. ``start``/``stop`` run the loops among them, stopped in reverse before the
Redis client closes."""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis

from engine.protocol import EngineClient
from engine.structured.compiler import GrammarCompiler
from gateway.bus.keys import RedisKeys
from gateway.config import GatewayConfig
from gateway.http.auth import AuthCache
from gateway.http.cancel import Canceller
from gateway.http.output_mux import OutputMux
from gateway.http.placement import Placement
from gateway.http.shedding import TierShedder
from gateway.http.shutdown import Shutdown
from gateway.model_info import ModelInfo
from gateway.telemetry.events import GatewayEvents
from gateway.tenancy.ledger import UsageLedger
from gateway.tenancy.quota import QuotaEnforcer
from gateway.tenancy.tenants import TenantStore
from gateway.worker.worker import Worker


@dataclass(frozen=True)
class Services:
    config: GatewayConfig
    redis: Redis
    keys: RedisKeys
    store: TenantStore
    auth: AuthCache
    quota: QuotaEnforcer
    canceller: Canceller
    model: ModelInfo
    events: GatewayEvents
    mux: OutputMux  # the one reader of every in-flight output stream
    shedder: TierShedder  # early shedding from the workers' published tier status
    placement: Placement  # the preferred worker of each new request (prefix-aware placement)
    engine: EngineClient | None = None  # set when this process also runs a worker
    worker: Worker | None = None
    shutdown: Shutdown = field(default_factory=Shutdown)  # mutable inside: the frozen field
    # structured outputs: the gateway's own compile of each request's grammar (the 400s)
    grammars: GrammarCompiler | None = None

    @classmethod
    def create(cls, config: GatewayConfig, redis: Redis, secret: bytes, model: ModelInfo,
               events: GatewayEvents, engine: EngineClient | None = None,
               worker_type: type[Worker] = Worker) -> Services:
        """Everything, built here once; a ``worker_type`` too when ``engine`` is given."""
        keys = RedisKeys(config.namespace)
        store = TenantStore(redis, keys, secret)
        lease_ms = int((config.request_timeout_s + 60) * 1000)
        req_ttl = int(config.request_timeout_s + config.stream_ttl_s)
        return cls(
            config=config, redis=redis, keys=keys, store=store,
            auth=AuthCache(store, secret, config.auth_cache_s),
            quota=QuotaEnforcer(redis, keys, config.queue_max_len, lease_ms, req_ttl,
                                config.usage_retention_days * 86400 if config.ledger else 0,
                                config.prices.get(model.name)),
            canceller=Canceller(redis, keys, config.stream_ttl_s),
            model=model, events=events, mux=OutputMux(redis), engine=engine,
            shedder=TierShedder(redis, keys, config), placement=Placement(config),
            worker=worker_type(redis, engine, config, events) if engine is not None else None,
            grammars=GrammarCompiler(model.tokenizer, _eos(model.tokenizer)),
        )

    async def start(self) -> None:
        await UsageLedger(self.redis, self.keys).register_model(self.model.name)
        self.mux.start()
        if self.worker is not None:
            await self.worker.start()
        await self.events.start(self)  # telemetry sees the engine and worker running

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
        await self.events.stop()
        await self.mux.stop()
        await self.quota.close()


def _eos(tokenizer: object) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if isinstance(eos, int) else []
