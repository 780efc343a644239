"""The CPU layer ops (``kernels.cpu_layer_ops``) against their torch references: rotary bit for
bit (the same products and sums), RMSNorm (+ residual) and SiLU-mul to fp32 rounding, on the
strided q/k views one qkv projection gives; the dispatch (fp32 CPU takes the ops, float64 keeps
the references) and the fallback when the ops are not built: the public functions then return
the references' numbers exactly, and the engine still runs. The KV write equals
``write_kv_cache_ref`` bit for bit (v a strided view of the projection, as the model has it). Built by ``make setup``; where no
compiler was found the op tests are skipped with that reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernels
from engine import LLM, SamplingParams
from kernels import cpu_layer_ops
from kernels.activation import silu_and_mul_ref
from kernels.kv_cache import write_kv_cache_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rotary import rope_cos_sin, rotary_embedding_ref

built = pytest.mark.skipif(not cpu_layer_ops.available(),
                           reason="kernels.cpu_layer_ops not built (no C++ compiler at setup)")


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _qkv(tokens: int, heads: int, kv_heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as the model has them: strided views into one [T, (Hq + 2 Hk) D] projection."""
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim, seed=tokens)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)


@built
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), [(1, 9, 3, 64), (70, 4, 2, 16),
                                                                  (130, 6, 6, 32)])
def test_rotary_is_bit_exact(tokens: int, heads: int, kv_heads: int, dim: int) -> None:
    q, k = _qkv(tokens, heads, kv_heads, dim)
    assert tokens == 1 or not q.is_contiguous()  # rows strided like the model's views
    table = rope_cos_sin(dim, 4096, 10000.0)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(1))
    got_q, got_k = cpu_layer_ops.rotary(positions, q, k, table)
    ref_q, ref_k = rotary_embedding_ref(positions, q, k, table)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


@built
def test_rotary_position_outside_the_table_raises() -> None:
    q, k = _qkv(2, 4, 2, 16)
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_layer_ops.rotary(torch.tensor([0, 64]), q, k, rope_cos_sin(16, 64, 10000.0))


@built
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 576), (3, 100), (130, 64)])
def test_rms_norm_and_fused_add_match_the_references(tokens: int, hidden: int) -> None:
    x, res = _randn(tokens, hidden, seed=2) * 3, _randn(tokens, hidden, seed=3)
    w = _randn(hidden, seed=4)
    torch.testing.assert_close(cpu_layer_ops.rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5),
                               atol=1e-6, rtol=1e-5)
    out, summed = cpu_layer_ops.add_rms_norm(x, res, w, 1e-5)
    ref_out, ref_sum = fused_add_rms_norm_ref(x, res, w, 1e-5)
    assert torch.equal(summed, ref_sum)  # one fp32 add, the same rounding
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-5)


@built
@pytest.mark.parametrize(("tokens", "inter"), [(1, 1536), (33, 100), (5, 7)])
def test_silu_mul_matches_the_reference(tokens: int, inter: int) -> None:
    x = _randn(tokens, 2 * inter, seed=5) * 6  # tails of the sigmoid on both sides
    x[0, :2] = torch.tensor([-100.0, 100.0])
    torch.testing.assert_close(cpu_layer_ops.silu_mul(x), silu_and_mul_ref(x), atol=1e-6,
                               rtol=1e-6)


@built
def test_dispatch_takes_the_ops_for_fp32_and_the_references_for_float64() -> None:
    x64 = _randn(4, 32, seed=6, dtype=torch.float64)
    assert cpu_layer_ops.usable(x64.float()) and not cpu_layer_ops.usable(x64)
    w64 = _randn(32, seed=7, dtype=torch.float64)
    assert torch.equal(kernels.rms_norm(x64, w64, 1e-6), rms_norm_ref(x64, w64, 1e-6))
    assert torch.equal(kernels.silu_and_mul(x64), silu_and_mul_ref(x64))


def test_without_the_ops_the_public_functions_are_the_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_layer_ops, "available", lambda: False)
    x, res, w = _randn(5, 48, seed=8), _randn(5, 48, seed=9), _randn(48, seed=10)
    assert torch.equal(kernels.rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))
    for got, ref in zip(kernels.fused_add_rms_norm(x, res, w, 1e-5),
                        fused_add_rms_norm_ref(x, res, w, 1e-5), strict=True):
        assert torch.equal(got, ref)
    assert torch.equal(kernels.silu_and_mul(x), silu_and_mul_ref(x))
    q, k = _qkv(3, 4, 2, 16)
    positions, table = torch.tensor([0, 5, 9]), rope_cos_sin(16, 16, 10000.0)
    for got, ref in zip(kernels.rotary_embedding(positions, q, k, table),
                        rotary_embedding_ref(positions, q, k, table), strict=True):
        assert torch.equal(got, ref)


@built
@pytest.mark.parametrize(("tokens", "kv_heads", "dim"), [(1, 3, 64), (37, 2, 16)])
def test_kv_write_equals_the_reference(tokens: int, kv_heads: int, dim: int) -> None:
    qkv = _randn(tokens, 4 * kv_heads * dim, seed=11)
    k = qkv[:, 2 * kv_heads * dim:3 * kv_heads * dim].contiguous().view(tokens, kv_heads, dim)
    v = qkv[:, 3 * kv_heads * dim:].view(tokens, kv_heads, dim)  # rows strided
    slots = torch.randperm(12 * 8, generator=torch.Generator().manual_seed(12))[:tokens]
    kc, vc = _randn(12, 8, kv_heads, dim, seed=13), _randn(12, 8, kv_heads, dim, seed=14)
    caches = [kc, vc, kc.clone(), vc.clone()]
    kernels.write_kv_cache(k, v, caches[0], caches[1], slots)
    write_kv_cache_ref(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0].view(-1, kv_heads, dim)[slots], k)  # the write happened
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_layer_ops.write_kv(k, v, caches[0], caches[1], slots + 12 * 8)



@built
@pytest.mark.parametrize(("tokens", "kv_heads", "dim"), [(1, 3, 64), (37, 2, 20)])
def test_kv_write_into_fp16_cache_rounds_as_the_reference(tokens: int, kv_heads: int,
                                                          dim: int) -> None:
    # dim 20: rows of 40 and 60 halves, past the 8-wide conversion's multiple
    qkv = _randn(tokens, 4 * kv_heads * dim, seed=21) * 3
    k = qkv[:, 2 * kv_heads * dim:3 * kv_heads * dim].contiguous().view(tokens, kv_heads, dim)
    v = qkv[:, 3 * kv_heads * dim:].view(tokens, kv_heads, dim)  # rows strided
    slots = torch.randperm(12 * 8, generator=torch.Generator().manual_seed(22))[:tokens]
    kc = _randn(12, 8, kv_heads, dim, seed=23, dtype=torch.float16)
    vc = _randn(12, 8, kv_heads, dim, seed=24, dtype=torch.float16)
    caches = [kc, vc, kc.clone(), vc.clone()]
    assert cpu_layer_ops.cache_usable(caches[0], caches[1])
    cpu_layer_ops.write_kv(k, v, caches[0], caches[1], slots)  # the op itself
    write_kv_cache_ref(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    for cache in caches:
        cache.zero_()
    assert cpu_layer_ops.usable(k, v)  # the dispatch takes it too
    kernels.write_kv_cache(k, v, caches[0], caches[1], slots)
    write_kv_cache_ref(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0].view(-1, kv_heads, dim)[slots], k.half())  # written, rounded


@built
def test_engine_gives_the_same_tokens_with_and_without_the_ops(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    with_ops = [o.token_ids for o in LLM(model=str(tiny_model_dir), num_blocks=32).generate(
        prompts, params)]
    monkeypatch.setattr(cpu_layer_ops, "available", lambda: False)
    without = [o.token_ids for o in LLM(model=str(tiny_model_dir), num_blocks=32).generate(
        prompts, params)]
    assert with_ops == without
