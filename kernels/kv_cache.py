"""Writing new keys/values into the paged KV cache: Triton kernel and torch reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import (
    INDEX_DTYPES,
    check_contiguous,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v: [T, Hk, D]; caches: [num_blocks, block_size, Hk, D]; slot_mapping: [T] int64,
    slot = block_id * block_size + offset. Writes in place."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, n_heads, head_dim, n_slots,
    H_PAD: tl.constexpr, D_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, H_PAD)[:, None]
    cols = tl.arange(0, D_PAD)[None, :]
    mask = (heads < n_heads) & (cols < head_dim)
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + cols, mask=mask, other=0.0)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + cols, mask=mask, other=0.0)
    # A slot outside the cache (e.g. -1 padding) is skipped, never written out of bounds.
    # (Broadcast the scalar first: the interpreter rejects block & scalar-bool masks.)
    slots = slot + tl.zeros([H_PAD, D_PAD], tl.int64)
    store_mask = mask & (slots >= 0) & (slots < n_slots)
    dst = slots * n_heads * head_dim + heads * head_dim + cols
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=store_mask)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=store_mask)


def write_kv_cache_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as write_kv_cache_ref. Slots outside [0, num_blocks*block_size) are
    skipped (the reference raises on them; here a device-side check would cost a sync)."""
    name = "write_kv_cache"
    check_tensor(f"{name}: k", k, 3)
    check_tensor(f"{name}: v", v, 3)
    check_tensor(f"{name}: k_cache", k_cache, 4)
    check_tensor(f"{name}: v_cache", v_cache, 4)
    check_tensor(f"{name}: slot_mapping", slot_mapping, 1, INDEX_DTYPES)
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    check_same_dtype(k_cache=k_cache, v_cache=v_cache)
    check_shape(f"{name}: v_cache", v_cache, k_cache.shape)
    n_tokens = k.shape[0]
    check_shape(f"{name}: k", k, (n_tokens, *k_cache.shape[2:]))
    check_shape(f"{name}: v", v, (n_tokens, *k_cache.shape[2:]))
    check_shape(f"{name}: slot_mapping", slot_mapping, (n_tokens,))
    check_contiguous(f"{name}: k_cache", k_cache)
    check_contiguous(f"{name}: v_cache", v_cache)
    check_last_dim_contiguous(f"{name}: k", k)
    check_last_dim_contiguous(f"{name}: v", v)
    if n_tokens == 0:
        return
    n_blocks, block_size, n_heads, head_dim = k_cache.shape
    _write_kv_kernel[(n_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), n_heads, head_dim,
        n_blocks * block_size,
        H_PAD=triton.next_power_of_2(n_heads), D_PAD=triton.next_power_of_2(head_dim),
    )
