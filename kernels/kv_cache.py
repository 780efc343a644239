"""Writing new keys/values into the paged KV cache: torch reference."""

from __future__ import annotations

import torch


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v: [T, Hk, D]; caches: [num_blocks, block_size, Hk, D]; slot_mapping: [T] int64,
    slot = block_id * block_size + offset. Writes in place."""
    block_size = k_cache.shape[1]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
    del block_size
