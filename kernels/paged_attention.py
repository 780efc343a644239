"""Paged attention over a flattened, ragged batch: torch reference.

Request r owns query rows ``query_start_loc[r]:query_start_loc[r+1]`` of ``q`` and has
``seq_lens[r]`` tokens of context in the cache (including its new tokens, already written).
Its query token i sits at position ``seq_lens[r] - q_len + i`` and attends causally.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [N, B, Hk, D]; block_tables: [R, max_blocks] int32;
    seq_lens: [R]; query_start_loc: [R+1]. Returns [T, Hq, D]."""
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_size = k_cache.shape[1]
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for r, ctx in enumerate(lens):
        s, e = starts[r], starts[r + 1]
        q_len = e - s
        if q_len == 0:
            continue
        nb = (ctx + block_size - 1) // block_size
        blocks = block_tables[r, :nb].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, k_cache.shape[-1])[:ctx]
        v = v_cache[blocks].reshape(-1, num_kv_heads, v_cache.shape[-1])[:ctx]
        # [H, q_len, D] x [H, ctx, D]; GQA by repeating KV heads
        qh = q[s:e].transpose(0, 1)
        kh = k.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        vh = v.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        mask = None
        if q_len > 1:
            # query i (position ctx - q_len + i) sees keys 0..ctx - q_len + i
            qpos = torch.arange(ctx - q_len, ctx).unsqueeze(1)
            kpos = torch.arange(ctx).unsqueeze(0)
            mask = kpos <= qpos
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        out[s:e] = o.transpose(0, 1)
    return out
