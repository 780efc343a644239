"""RMSNorm (+ fused add), rotary, SiLU-and-mul and the KV-cache write: Triton kernels (forced
through the public functions, run by the interpreter) vs their torch references."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kernels
from kernels.activation import silu_and_mul_ref
from kernels.kv_cache import write_kv_cache_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rotary import rotary_embedding_ref

DTYPES = [torch.float32, torch.float16]
# fp16 references round after every op; the kernels compute in fp32 and round once.
TOL: dict[torch.dtype, dict[str, Any]] = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float16: {"atol": 5e-3, "rtol": 5e-3}}


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 64), (7, 576), (3, 100)])
def test_rms_norm(tokens: int, hidden: int, dtype: torch.dtype) -> None:
    x = _randn(tokens, hidden, dtype=dtype) * 3
    w = _randn(hidden, dtype=dtype, seed=1)
    out = kernels.rms_norm(x, w, 1e-5, triton=True)
    assert out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 64), (5, 96)])
def test_fused_add_rms_norm(tokens: int, hidden: int, dtype: torch.dtype) -> None:
    x, res = _randn(tokens, hidden, dtype=dtype), _randn(tokens, hidden, dtype=dtype, seed=2)
    w = _randn(hidden, dtype=dtype, seed=1)
    out, summed = kernels.fused_add_rms_norm(x, res, w, 1e-6, triton=True)
    ref_out, ref_summed = fused_add_rms_norm_ref(x, res, w, 1e-6)
    torch.testing.assert_close(summed, ref_summed, atol=0, rtol=0)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])


def test_rms_norm_with_fp32_weight_promotes_like_reference() -> None:
    x, w = _randn(3, 64, dtype=torch.float16), _randn(64, dtype=torch.float32)
    out = kernels.rms_norm(x, w, 1e-6, triton=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 128), (2, 1, 48)])
def test_rotary_on_fused_qkv_views(heads: int, kv_heads: int, head_dim: int,
                                   dtype: torch.dtype) -> None:
    tokens = 6
    table = kernels.rope_cos_sin(head_dim, 300, 10000.0)
    qkv = _randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.tensor([0, 1, 17, 299, 5, 128])
    q_out, k_out = kernels.rotary_embedding(positions, q, k, table, triton=True)
    q_ref, k_ref = rotary_embedding_ref(positions, q, k, table)
    torch.testing.assert_close(q_out, q_ref, **TOL[dtype])
    torch.testing.assert_close(k_out, k_ref, **TOL[dtype])
    torch.testing.assert_close(q_out[0], q[0], atol=0, rtol=0)  # position 0 is the identity


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "inter"), [(1, 64), (5, 1536), (3, 40)])
def test_silu_and_mul(tokens: int, inter: int, dtype: torch.dtype) -> None:
    x = _randn(tokens, 2 * inter, dtype=dtype) * 4
    out = kernels.silu_and_mul(x, triton=True)
    assert out.shape == (tokens, inter) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_ref(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("block_size", "kv_heads", "head_dim"), [(16, 3, 64), (32, 2, 128)])
def test_write_kv_cache(block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    n_blocks, tokens = 4, 7
    kv = _randn(tokens, 2 * kv_heads * head_dim, dtype=dtype)
    k = kv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)  # strided views
    v = kv[:, kv_heads * head_dim :].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(n_blocks * block_size, generator=torch.Generator().manual_seed(3))
    slots = slots[:tokens]
    k_cache = _randn(n_blocks, block_size, kv_heads, head_dim, dtype=dtype, seed=4)
    v_cache = _randn(n_blocks, block_size, kv_heads, head_dim, dtype=dtype, seed=5)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kernels.write_kv_cache(k, v, k_cache, v_cache, slots, triton=True)
    write_kv_cache_ref(k, v, k_ref, v_ref, slots)
    # A copy: bit-exact, and every slot not in the mapping is untouched.
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_write_kv_cache_skips_padding_slots() -> None:
    k = _randn(3, 2, 16, dtype=torch.float32)
    k_cache = torch.zeros(2, 16, 2, 16)
    v_cache = torch.zeros(2, 16, 2, 16)
    kernels.write_kv_cache(k, k, k_cache, v_cache, torch.tensor([5, -1, 31]), triton=True)
    flat = k_cache.view(-1, 2, 16)
    assert torch.equal(flat[5], k[0]) and torch.equal(flat[31], k[2])
    assert int((flat.abs().sum((1, 2)) > 0).sum()) == 2
