"""Bad launches fail loudly before the kernel runs: a ValueError that names the problem."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kernels
from tests.kernels.factories import PagedBatch, make_paged_batch


def _batch() -> PagedBatch:
    return make_paged_batch([2, 1], [5, 20], num_heads=4, num_kv_heads=2, head_dim=16)


def _attn(**overrides: Any) -> Callable[[], Any]:
    args: dict[str, Any] = dict(zip(["q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc",
                     "scale"], _batch().args()))
    args.update(overrides)
    return lambda: kernels.paged_attention(**args, triton=True)


b = _batch()
ATTENTION_CASES = {
    "q must have 3 dims": _attn(q=b.q.reshape(b.q.shape[0], -1)),
    "share one dtype": _attn(k_cache=b.k_cache.half()),
    "not a multiple of": _attn(q=torch.randn(3, 3, 16)),
    "head_dim 32": _attn(q=torch.randn(3, 4, 32)),
    "block_tables has dtype": _attn(block_tables=b.block_tables.float()),
    "seq_lens has shape": _attn(seq_lens=b.seq_lens[:1]),
    "query_start_loc has shape": _attn(query_start_loc=b.query_start_loc[:2]),
    "k_cache must be contiguous": _attn(k_cache=torch.randn(16, *b.k_cache.shape[:1], 2, 16)
                                        .transpose(0, 1)),
    "v_cache has shape": _attn(v_cache=b.v_cache[:, :8]),
    "stride 1 in its last dim": _attn(q=b.q.transpose(1, 2).contiguous().transpose(1, 2)),
    "block_tables has 3 columns": _attn(seq_lens=torch.tensor([5, 60], dtype=torch.int32)),
    "outside": _attn(block_tables=b.block_tables + 100),
    "must rise from 0": _attn(query_start_loc=torch.tensor([0, 2, 1], dtype=torch.int32)),
    "shorter than the query lengths": _attn(seq_lens=torch.tensor([1, 20], dtype=torch.int32)),
    "one device": _attn(seq_lens=b.seq_lens.to("meta")),
}


@pytest.mark.parametrize("message", list(ATTENTION_CASES))
def test_paged_attention_rejects(message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ATTENTION_CASES[message]()


def test_paged_attention_rejects_non_tensor() -> None:
    args: list[Any] = list(_batch().args())
    args[4] = [5, 20]
    with pytest.raises(ValueError, match="seq_lens must be a torch.Tensor"):
        kernels.paged_attention(*args, triton=True)


k = torch.randn(3, 2, 16)
cache = torch.zeros(4, 16, 2, 16)
slots = torch.tensor([0, 1, 2])
x = torch.randn(3, 32)
w = torch.ones(32)
table = kernels.rope_cos_sin(16, 10, 10000.0)
OTHER_CASES: dict[str, tuple[str, Callable[[], Any]]] = {
    "kv heads": ("k has shape", lambda: kernels.write_kv_cache(
        torch.randn(3, 3, 16), k, cache, cache.clone(), slots, triton=True)),
    "slot dtype": ("slot_mapping has dtype", lambda: kernels.write_kv_cache(
        k, k, cache, cache.clone(), slots.float(), triton=True)),
    "slot count": ("slot_mapping has shape", lambda: kernels.write_kv_cache(
        k, k, cache, cache.clone(), slots[:2], triton=True)),
    "cache layout": ("k_cache must be contiguous", lambda: kernels.write_kv_cache(
        k, k, cache.transpose(0, 1), cache.transpose(0, 1), slots, triton=True)),
    "cache dtypes": ("share one dtype", lambda: kernels.write_kv_cache(
        k, k, cache, cache.half(), slots, triton=True)),
    "norm weight": ("x has shape", lambda: kernels.rms_norm(x, torch.ones(16), 1e-6, triton=True)),
    "norm dtype": ("x has dtype", lambda: kernels.rms_norm(x.long(), w, 1e-6, triton=True)),
    "residual shape": ("residual has shape", lambda: kernels.fused_add_rms_norm(
        x, x[:2], w, 1e-6, triton=True)),
    "residual dtype": ("share one dtype", lambda: kernels.fused_add_rms_norm(
        x, x.half(), w, 1e-6, triton=True)),
    "rope table": ("match the cos_sin table", lambda: kernels.rotary_embedding(
        torch.arange(3), torch.randn(3, 2, 32), torch.randn(3, 1, 32), table, triton=True)),
    "rope positions": ("positions has dtype", lambda: kernels.rotary_embedding(
        torch.arange(3).float(), k, k, table, triton=True)),
    "rope tokens": ("must agree in tokens", lambda: kernels.rotary_embedding(
        torch.arange(3), k, k[:2], table, triton=True)),
    "silu odd": ("must be even", lambda: kernels.silu_and_mul(torch.randn(2, 5), triton=True)),
}


@pytest.mark.parametrize("case", list(OTHER_CASES))
def test_other_ops_reject(case: str) -> None:
    message, call = OTHER_CASES[case]
    with pytest.raises(ValueError, match=message):
        call()
