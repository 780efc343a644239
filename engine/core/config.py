"""Engine configuration: frozen dataclasses, validated in one place (``__post_init__``).

``EngineConfig.from_kwargs(**kw)`` routes flat keyword arguments (as ``LLM(...)`` and the CLI
pass them) to the sub-config that owns each field, and rejects unknown names.

The engine's environment is read here and nowhere else, once per config:
``CARPOOL_FORCE_TRITON=1`` turns a ``use_triton`` left at None (by device) into True.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

BatchingMode = Literal["continuous", "static", "dynamic"]
PreemptionMode = Literal["recompute", "swap"]
DType = Literal["float32", "bfloat16", "float16", "float64"]
KVCacheDType = Literal["auto", "float16"]
FORCE_TRITON_ENV = "CARPOOL_FORCE_TRITON"  # "1": Triton kernels even where the device says no


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = None  # local HF checkpoint dir; None = bundled SmolLM2-135M-Instruct
    dtype: DType = "float32"
    device: str = "cpu"
    max_model_len: int | None = None  # None = the model's own max_position_embeddings
    cache_dir: str | None = None  # where converted checkpoints live; None = ~/.cache/carpool
    # "int8": int8 weights in the layers' linears and the LM head (weight-only,
    # kernels/cpu_int8_linear.py; CPU); None = as loaded
    quantization: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16", "float64"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.quantization not in (None, "int8"):
            raise ValueError(f"unsupported quantization {self.quantization!r} (only int8)")
        if self.quantization and (self.device != "cpu" or self.dtype != "float32"):
            raise ValueError("quantization int8 needs device cpu and dtype float32")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if self.model is not None and not Path(self.model).is_dir():
            raise ValueError(f"model directory not found: {self.model} (no model hub is used)")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_memory_gb: float = 1.0  # device pool budget; sizes num_blocks
    num_blocks: int | None = None  # explicit override (tests)
    swap_space_gb: float = 0.5  # CPU swap pool budget
    num_cpu_blocks: int | None = None  # explicit override (tests)
    enable_prefix_caching: bool = True
    # "auto": the model's dtype; "float16": half the bytes a token (fp32 weights on CPU: the
    # decode op widens each element as it reads it), lossy, opt-in, like llama.cpp's f16 KV
    kv_cache_dtype: KVCacheDType = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in ("auto", "float16"):
            raise ValueError(f"unsupported kv_cache_dtype {self.kv_cache_dtype!r} "
                             "(auto or float16)")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ValueError("num_cpu_blocks must be >= 0")
        if self.kv_cache_memory_gb <= 0 or self.swap_space_gb < 0:
            raise ValueError("memory budgets must be positive")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    batching: BatchingMode = "continuous"
    max_wait_ms: float = 50.0  # dynamic batching: start a batch when full or after this
    preemption_mode: PreemptionMode = "recompute"
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.batching not in ("continuous", "static", "dynamic"):
            raise ValueError(f"unknown batching mode {self.batching!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"unknown preemption mode {self.preemption_mode!r}")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    use_triton: bool | None = None  # None = Triton on CUDA, torch references on CPU
    # the step thread's torch thread count chosen each step by contention
    # (engine/runner/step_threads.py); off by default: rounding may differ between counts
    adaptive_threads: bool = False

    def __post_init__(self) -> None:
        if self.use_triton is None and os.environ.get(FORCE_TRITON_ENV) == "1":
            object.__setattr__(self, "use_triton", True)  # frozen: set once, here
        if self.cache.kv_cache_dtype == "float16" and (
                self.model.device != "cpu" or self.use_triton
                or self.model.dtype not in ("float32", "float64")):
            # the Triton kernels read a cache in the queries' dtype; a 16-bit model's "auto"
            # cache is 2 bytes already (and bf16 values past fp16's range would become inf)
            raise ValueError("kv_cache_dtype float16 needs the CPU path (device cpu, no "
                             "Triton) and dtype float32 or float64")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        parts: dict[str, dict[str, Any]] = {"model": {}, "cache": {}, "scheduler": {}}
        owners = {
            "model": ModelConfig,
            "cache": CacheConfig,
            "scheduler": SchedulerConfig,
        }
        top: dict[str, Any] = {}
        for key, value in kwargs.items():
            owner = next(
                (name for name, c in owners.items() if key in _field_names(c)), None
            )
            if owner is not None:
                parts[owner][key] = value
            elif key in _field_names(cls):
                top[key] = value
            else:
                raise TypeError(f"unknown engine option {key!r}")
        return cls(
            model=ModelConfig(**parts["model"]),
            cache=CacheConfig(**parts["cache"]),
            scheduler=SchedulerConfig(**parts["scheduler"]),
            **top,
        )


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
