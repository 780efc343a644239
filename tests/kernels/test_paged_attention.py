"""Paged attention: Triton kernel (interpreter) vs the torch reference, plus the reference vs a
textbook float64 implementation."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.paged_attention import paged_attention_ref, paged_attention_triton, pick_splits
from tests.kernels.factories import make_paged_batch, naive_attention

# Tolerances that also hold on a GPU (fp16 there multiplies P in fp16 on tensor cores).
TOL: dict[torch.dtype, dict[str, Any]] = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 1e-2, "rtol": 1e-2}}

# (q_lens, ctx_lens): a decode batch; and a mixed batch with a whole prompt, a decode, an idle
# request and a chunked prefill whose chunk starts mid-block.
DECODE = ([1, 1, 1, 1], [1, 16, 33, 70])
MIXED = ([5, 1, 0, 12], [5, 40, 7, 30])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lens", [DECODE, MIXED], ids=["decode", "mixed"])
def test_matches_reference(
    lens: tuple[list[int], list[int]], head_dim: int, block_size: int, dtype: torch.dtype,
) -> None:
    batch = make_paged_batch(*lens, num_heads=9, num_kv_heads=3, head_dim=head_dim,
                             block_size=block_size, dtype=dtype)
    out = kernels.paged_attention(*batch.args(), triton=True)
    ref = paged_attention_ref(*batch.args())
    assert out.dtype == dtype and out.shape == batch.q.shape
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 1), (6, 2)])
def test_gqa_groups(num_heads: int, num_kv_heads: int) -> None:
    batch = make_paged_batch(*MIXED, num_heads=num_heads, num_kv_heads=num_kv_heads)
    torch.testing.assert_close(paged_attention_triton(*batch.args()),
                               paged_attention_ref(*batch.args()), **TOL[torch.float32])


@pytest.mark.parametrize("num_splits", [2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_kv_combine(num_splits: int, dtype: torch.dtype) -> None:
    # Long contexts over small tiles, so every split has keys, and one short request whose
    # later splits are empty.
    batch = make_paged_batch([1, 3, 1], [150, 131, 9], num_heads=8, num_kv_heads=2,
                             block_size=16, dtype=dtype)
    out = paged_attention_triton(*batch.args(), num_splits=num_splits, tile_n=16)
    torch.testing.assert_close(out, paged_attention_ref(*batch.args()), **TOL[dtype])


def test_prefill_spanning_several_query_blocks() -> None:
    # 70 query tokens with group 2 -> query blocks of 32 tokens: three blocks, the causal
    # horizon differs per block.
    batch = make_paged_batch([70, 1], [75, 3], num_heads=4, num_kv_heads=2, block_size=16)
    torch.testing.assert_close(paged_attention_triton(*batch.args(), tile_n=32),
                               paged_attention_ref(*batch.args()), **TOL[torch.float32])


def test_strided_query_view() -> None:
    # The model slices q out of a fused qkv projection: rows are strided, heads contiguous.
    batch = make_paged_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=64)
    qkv = torch.randn(batch.q.shape[0], 8 * 64)
    qkv[:, : 4 * 64] = batch.q.reshape(batch.q.shape[0], -1)
    q_view = qkv[:, : 4 * 64].view(-1, 4, 64)
    assert not q_view.is_contiguous()
    args = (q_view, *batch.args()[1:])
    torch.testing.assert_close(paged_attention_triton(*args), paged_attention_ref(*batch.args()),
                               **TOL[torch.float32])


def test_reference_matches_textbook_attention() -> None:
    batch = make_paged_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16)
    torch.testing.assert_close(paged_attention_ref(*batch.args()).double(),
                               naive_attention(batch), atol=1e-5, rtol=1e-5)


def test_kernel_matches_textbook_attention() -> None:
    batch = make_paged_batch([3, 1], [20, 33], num_heads=6, num_kv_heads=3, head_dim=16)
    torch.testing.assert_close(paged_attention_triton(*batch.args(), num_splits=2).double(),
                               naive_attention(batch), atol=1e-5, rtol=1e-5)


def test_split_heuristic() -> None:
    # H200-like: 132 SMs. One SmolLM2 request (3 KV heads) at 4096 tokens = 64 tiles: split.
    assert pick_splits(132, n_programs=3, max_tiles=64) == 32
    # A short context caps the splits at 2 tiles each.
    assert pick_splits(132, n_programs=3, max_tiles=8) == 4
    # 256 requests x 3 KV heads already fill the GPU: no split, no combine pass.
    assert pick_splits(132, n_programs=768, max_tiles=64) == 1
    assert pick_splits(None, n_programs=1, max_tiles=64) == 1  # interpreter


def test_int64_metadata() -> None:
    batch = make_paged_batch(*MIXED, num_heads=4, num_kv_heads=2)
    args = list(batch.args())
    for i in (3, 4, 5):  # block_tables, seq_lens, query_start_loc
        args[i] = args[i].long()
    torch.testing.assert_close(paged_attention_triton(*args), paged_attention_ref(*batch.args()),
                               **TOL[torch.float32])


@settings(max_examples=12, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 40)), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 3]),
    block_size=st.sampled_from([16, 32]),
    num_splits=st.sampled_from([None, 2, 3]),
)
def test_random_ragged_batches(requests: list[tuple[int, int]], group: int, block_size: int,
                               num_splits: int | None) -> None:
    # Each request: q_len new tokens on top of `extra` cached ones (ctx >= 1).
    q_lens = [q for q, _ in requests]
    ctx_lens = [max(1, q + extra) for q, extra in requests]
    batch = make_paged_batch(q_lens, ctx_lens, num_heads=2 * group, num_kv_heads=2,
                             head_dim=16, block_size=block_size)
    out = paged_attention_triton(*batch.args(), num_splits=num_splits, tile_n=16)
    torch.testing.assert_close(out, paged_attention_ref(*batch.args()), **TOL[torch.float32])
