"""The CPU decode op (``kernels.cpu_decode``) against the torch reference and textbook
attention, on ragged batches with shuffled, non-contiguous blocks: the compiled head dims and
group sizes and the generic path, batches large enough to be split across threads (rows cut
between them and merged); and the dispatch: fp32 CPU takes the op, other dtypes keep the
reference. Built by ``make setup``; where no compiler was
found the op is absent and these tests are skipped with that reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import kernels
from engine import LLM, SamplingParams
from kernels import cpu_decode
from kernels.paged_attention import paged_attention_ref
from tests.kernels.factories import make_paged_batch, naive_attention

pytestmark = pytest.mark.skipif(not cpu_decode.available(),
                                reason="kernels.cpu_decode not built (no C++ compiler at setup)")


# (heads, kv_heads, head_dim, block_size): SmolLM2's 9/3/64 and the compiled group sizes;
# head dim 128; 80 and a group of 12 take the generic (runtime-shaped) path
SHAPES = [(4, 2, 64, 16), (9, 3, 64, 16), (4, 4, 64, 8), (6, 1, 64, 32), (8, 1, 128, 16),
          (6, 2, 80, 16), (12, 1, 32, 16)]


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "block_size"), SHAPES)
def test_matches_reference(heads: int, kv_heads: int, head_dim: int, block_size: int) -> None:
    ctx = [1, 17, 16, 100, 33, 64]
    batch = make_paged_batch([1] * len(ctx), ctx, num_heads=heads, num_kv_heads=kv_heads,
                             head_dim=head_dim, block_size=block_size, seed=heads + block_size)
    b = batch
    got = cpu_decode.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    torch.testing.assert_close(got, paged_attention_ref(*b.args()), atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(got.double(), naive_attention(b), atol=1e-5, rtol=1e-5)


# over 1024 tokens the op splits the batch's KV blocks evenly across the threads: one long
# row cut in pieces, rows cut at uneven points, more threads than the machine has cores
@pytest.mark.parametrize(("ctx", "n_threads"), [([3000], 2), ([3000], 5), ([1500, 7, 900, 33], 3),
                                                ([700, 1, 700, 650], 4), ([40] * 30, 2)])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (6, 2, 80)])
def test_rows_split_across_threads_match_reference(
    threads: None, ctx: list[int], n_threads: int, heads: int, kv_heads: int, head_dim: int,
) -> None:
    b = make_paged_batch([1] * len(ctx), ctx, num_heads=heads, num_kv_heads=kv_heads,
                         head_dim=head_dim, seed=len(ctx) + n_threads)
    torch.set_num_threads(n_threads)
    got = cpu_decode.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    torch.set_num_threads(1)  # the same numbers on one thread, no cut rows
    one = cpu_decode.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    ref = paged_attention_ref(*b.args())
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(one, ref, atol=2e-6, rtol=2e-5)



# an fp16 cache: the op widens each element as it loads it (the vector path and the generic
# one, one thread and rows cut across threads); the reference and the float64 textbook read
# the same fp16 numbers, widened by torch
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "ctx", "n_threads"),
                         [(9, 3, 64, [1, 17, 100, 33], 1), (8, 1, 128, [5, 64], 1),
                          (6, 2, 80, [40, 9], 1), (9, 3, 64, [1500, 7, 900], 2)])
def test_fp16_cache_matches_reference(threads: None, heads: int, kv_heads: int, head_dim: int,
                                      ctx: list[int], n_threads: int) -> None:
    b = make_paged_batch([1] * len(ctx), ctx, num_heads=heads, num_kv_heads=kv_heads,
                         head_dim=head_dim, seed=head_dim + len(ctx))
    b = dataclasses.replace(b, k_cache=b.k_cache.half(), v_cache=b.v_cache.half())
    torch.set_num_threads(n_threads)
    assert cpu_decode.usable(b.q, b.k_cache)
    got = cpu_decode.paged_decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    torch.testing.assert_close(got, paged_attention_ref(*b.args()), atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(got.double(), naive_attention(b), atol=1e-5, rtol=1e-5)
    # and not what the unrounded fp32 cache gives: the op really read the fp16 numbers
    full = make_paged_batch([1] * len(ctx), ctx, num_heads=heads, num_kv_heads=kv_heads,
                            head_dim=head_dim, seed=head_dim + len(ctx))
    assert not torch.allclose(got, paged_attention_ref(*full.args()), atol=1e-6, rtol=0)


def test_dispatch_uses_the_op_for_fp32_decode_rows_and_keeps_prefill_rows() -> None:
    batch = make_paged_batch([1, 5, 1], [40, 21, 9], num_heads=6, num_kv_heads=3, head_dim=16)
    torch.testing.assert_close(kernels.paged_attention(*batch.args()).double(),
                               naive_attention(batch), atol=1e-5, rtol=1e-5)
    assert cpu_decode.usable(batch.q, batch.k_cache)
    b64 = make_paged_batch([1, 1], [10, 20], dtype=torch.float64)
    assert not cpu_decode.usable(b64.q, b64.k_cache)


def test_bad_block_id_raises_instead_of_reading_outside_the_cache() -> None:
    b = make_paged_batch([1, 1], [20, 20], block_size=16)
    tables = b.block_tables.clone()
    tables[1, 1] = b.k_cache.shape[0] + 5
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_decode.paged_decode(b.q, b.k_cache, b.v_cache, tables, b.seq_lens, b.scale)


def test_engine_gives_the_same_tokens_with_and_without_the_op(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = [[1, 2, 3, 4], [5, 6, 7], list(range(8, 60))]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    with_op = [o.token_ids for o in LLM(model=str(tiny_model_dir), num_blocks=32).generate(
        prompts, params)]
    monkeypatch.setattr(cpu_decode, "available", lambda: False)
    without = [o.token_ids for o in LLM(model=str(tiny_model_dir), num_blocks=32).generate(
        prompts, params)]
    assert with_op == without
