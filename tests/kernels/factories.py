"""Small paged-attention batches for kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor, torch.Tensor, float]:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, self.scale)


def make_paged_batch(
    q_lens: list[int],
    ctx_lens: list[int],
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> PagedBatch:
    """Random q and caches; each request gets shuffled, non-contiguous blocks. Unused
    block-table entries point at another request's block and cache slots past each context
    hold random data, so a kernel that reads past a request's context gets a wrong answer."""
    assert len(q_lens) == len(ctx_lens) and all(q <= c for q, c in zip(q_lens, ctx_lens))
    gen = torch.Generator().manual_seed(seed)
    need = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    max_blocks = max(need) + 1
    tables = torch.full((len(q_lens), max_blocks), int(perm[-1]), dtype=torch.int32)
    used = 0
    for r, n in enumerate(need):
        tables[r, :n] = perm[used:used + n]
        used += n

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    k_cache = rand(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = rand(num_blocks, block_size, num_kv_heads, head_dim)
    q = rand(sum(q_lens), num_heads, head_dim)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    return PagedBatch(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables,
        seq_lens=torch.tensor(ctx_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        scale=head_dim ** -0.5,
    )


def naive_attention(batch: PagedBatch) -> torch.Tensor:
    """Textbook softmax(q k^T * scale + causal mask) v in float64, gathering each request's
    keys token by token from its block table: independent of the reference's SDPA path."""
    q, kc, vc = batch.q.double(), batch.k_cache.double(), batch.v_cache.double()
    block_size = kc.shape[1]
    group = q.shape[1] // kc.shape[2]
    out = torch.zeros_like(q)
    starts = batch.query_start_loc.tolist()
    for r, ctx in enumerate(batch.seq_lens.tolist()):
        s, e = starts[r], starts[r + 1]
        table = batch.block_tables[r].tolist()
        slots = [(table[i // block_size], i % block_size) for i in range(ctx)]
        k = torch.stack([kc[b, o] for b, o in slots])  # [ctx, Hk, D]
        v = torch.stack([vc[b, o] for b, o in slots])
        for i in range(e - s):
            pos = ctx - (e - s) + i
            for h in range(q.shape[1]):
                scores = (k[: pos + 1, h // group] @ q[s + i, h]) * batch.scale
                out[s + i, h] = torch.softmax(scores, 0) @ v[: pos + 1, h // group]
    return out
