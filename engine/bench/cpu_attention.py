"""The CPU decode attention's two paths timed on one layer of a decode batch (same run):
the torch reference (gather the blocks, then SDPA) and the C++ op reading blocks in place
(``kernels.cpu_decode``). Printed by ``carpool bench engine``."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kernels import cpu_decode
from kernels.paged_attention import _decode_batched


def _best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1000 * best


def decode_attention_line(rows: int = 100, heads: int = 9, kv_heads: int = 3, head_dim: int = 64,
                          max_ctx: int = 230, block_size: int = 16, repeats: int = 10) -> str:
    """SmolLM2's attention shape by default, contexts spread like the seed workload's."""
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(20, max_ctx, (rows,), generator=gen, dtype=torch.int32)
    nb = -(-max_ctx // block_size)
    n = rows * nb + 1
    kc = torch.randn(n, block_size, kv_heads, head_dim, generator=gen)
    vc = torch.randn(n, block_size, kv_heads, head_dim, generator=gen)
    tables = torch.randperm(n - 1, generator=gen)[: rows * nb].view(rows, nb).to(torch.int32)
    q = torch.randn(rows, heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    with torch.inference_mode():
        ref = _best_ms(lambda: _decode_batched(q, kc, vc, tables, ctx, scale), repeats)
        if not cpu_decode.available():
            return (f"decode attention, one layer, {rows} rows: torch gather+SDPA {ref:.2f} ms; "
                    f"the C++ op is not built (python -m kernels.build_ops cpu_decode)")
        op = _best_ms(lambda: cpu_decode.paged_decode(q, kc, vc, tables, ctx, scale), repeats)
    return (f"decode attention, one layer, {rows} rows, mean context {float(ctx.float().mean()):.0f}:"
            f" torch gather+SDPA {ref:.2f} ms, in-place C++ op {op:.2f} ms ({ref / op:.2f}x)")
