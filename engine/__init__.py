"""Carpool's in-process engine.

``from engine import LLM, SamplingParams`` is the offline API. Imports are lazy so that the
torch-free parts (scheduler, block manager, requests) load without torch.
"""

from __future__ import annotations

from typing import Any

from engine.kernels_origin import ensure_own_kernels

ensure_own_kernels()  # before anything imports `kernels`: a foreign one fails here, in one line

from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "AsyncEngine", "EngineConfig", "LLMEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.frontend.llm import LLM

        return LLM
    if name == "AsyncEngine":
        from engine.frontend.async_engine import AsyncEngine

        return AsyncEngine
    if name == "LLMEngine":
        from engine.llm_engine import LLMEngine

        return LLMEngine
    if name == "EngineConfig":
        from engine.core.config import EngineConfig

        return EngineConfig
    raise AttributeError(name)
