"""Hot ops of the engine. Each public function dispatches to a Triton kernel (CUDA, or forced
under TRITON_INTERPRET=1) or, on CPU, to a C++ op when it is built and takes the dtype
(fp32: ``kernels.cpu_layer_ops``, ``kernels.cpu_decode``, the KV write) and to its torch reference
otherwise (float64 always). Signatures are the contract the model code relies on. ``triton``
forces a path (None = by device and dtype, see kernels.dispatch)."""

from __future__ import annotations

import torch

from kernels import cpu_decode, cpu_layer_ops
from kernels.activation import silu_and_mul_ref, silu_and_mul_triton
from kernels.dispatch import use_triton
from kernels.kv_cache import write_kv_cache_ref, write_kv_cache_triton
from kernels.paged_attention import paged_attention_ref, paged_attention_triton
from kernels.rms_norm import (
    fused_add_rms_norm_ref,
    fused_add_rms_norm_triton,
    rms_norm_ref,
    rms_norm_triton,
)
from kernels.rotary import rope_cos_sin, rotary_embedding_ref, rotary_embedding_triton

__all__ = [
    "fused_add_rms_norm",
    "paged_attention",
    "rms_norm",
    "rope_cos_sin",
    "rotary_embedding",
    "silu_and_mul",
    "use_triton",
    "write_kv_cache",
]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, triton: bool | None = None
) -> torch.Tensor:
    if use_triton(x, triton):
        return rms_norm_triton(x, weight, eps)
    if x.dim() == 2 and cpu_layer_ops.usable(x, weight):
        return cpu_layer_ops.rms_norm(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    if use_triton(x, triton):
        return fused_add_rms_norm_triton(x, residual, weight, eps)
    if x.dim() == 2 and residual.shape == x.shape and cpu_layer_ops.usable(x, residual, weight):
        return cpu_layer_ops.add_rms_norm(x, residual, weight, eps)
    return fused_add_rms_norm_ref(x, residual, weight, eps)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
    triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-layout rotary; returns new (q, k)."""
    if use_triton(q, triton):
        return rotary_embedding_triton(positions, q, k, cos_sin)
    if q.dim() == k.dim() == 3 and cpu_layer_ops.usable(q, k, cos_sin):
        return cpu_layer_ops.rotary(positions, q, k, cos_sin)
    return rotary_embedding_ref(positions, q, k, cos_sin)


def silu_and_mul(x: torch.Tensor, triton: bool | None = None) -> torch.Tensor:
    if use_triton(x, triton):
        return silu_and_mul_triton(x)
    if x.dim() == 2 and cpu_layer_ops.usable(x):
        return cpu_layer_ops.silu_mul(x)
    return silu_and_mul_ref(x)


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, triton: bool | None = None,
) -> None:
    """Scatters k, v [T, Hk, D] into the caches at slot_mapping; in place."""
    if use_triton(k, triton):
        write_kv_cache_triton(k, v, k_cache, v_cache, slot_mapping)
    elif (k.dim() == 3 and k_cache.is_contiguous() and v_cache.is_contiguous()
          and k.stride(1) == v.stride(1) == k.shape[2]
          and cpu_layer_ops.usable(k, v) and cpu_layer_ops.cache_usable(k_cache, v_cache)):
        cpu_layer_ops.write_kv(k, v, k_cache, v_cache, slot_mapping)
    else:
        write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
    triton: bool | None = None,
) -> torch.Tensor:
    """See kernels.paged_attention for the ragged-batch semantics."""
    if use_triton(q, triton):
        return paged_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale
        )
    # CPU: decode rows read the KV blocks in place when the C++ op is built (fp32 queries)
    decode = cpu_decode.paged_decode if cpu_decode.usable(q, k_cache) else None
    return paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                               decode)
