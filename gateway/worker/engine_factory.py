"""The engine a worker drives, built from the gateway config: the real ``AsyncEngine`` (torch,
imported only here and on first use) or the FAKE echo engine (no model: benchmarks and gateway
tests)."""

from __future__ import annotations

from engine.protocol import EngineClient
from gateway.config import GatewayConfig
from gateway.model_info import ECHO_MODEL_NAME, ModelInfo, load_model_info


def build_engine(config: GatewayConfig, info: ModelInfo | None = None) -> EngineClient:
    """``config.engine``'s engine; ``info`` spares the echo engine a second tokenizer load."""
    if config.engine == "echo":
        from engine.frontend.echo import FakeEchoEngine

        info = info or load_model_info(config)
        return FakeEchoEngine(info.tokenizer, ECHO_MODEL_NAME, info.max_model_len,
                              step_ms=config.echo_step_ms)
    from engine.core.config import EngineConfig
    from engine.frontend.async_engine import AsyncEngine

    options = {"adaptive_threads": config.adaptive_threads, **dict(config.engine_options)}
    return AsyncEngine(EngineConfig.from_kwargs(model=config.model, **options))
