"""Hot ops of the engine. Each public function dispatches to a Triton kernel (CUDA, or forced
under TRITON_INTERPRET=1) or to its torch reference (CPU). Signatures are the contract the
model code relies on."""

from __future__ import annotations

import torch

from kernels.activation import silu_and_mul_ref
from kernels.dispatch import set_use_triton, use_triton
from kernels.kv_cache import write_kv_cache_ref
from kernels.paged_attention import paged_attention_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rotary import rope_cos_sin, rotary_embedding_ref

__all__ = [
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "rope_cos_sin",
    "silu_and_mul",
    "write_kv_cache",
    "paged_attention",
    "set_use_triton",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_ref(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return fused_add_rms_norm_ref(x, residual, weight, eps)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return rotary_embedding_ref(positions, q, k, cos_sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return silu_and_mul_ref(x)


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
) -> torch.Tensor:
    return paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


_ = use_triton  # re-exported for the Triton dispatch added in #3
