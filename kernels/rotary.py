"""Rotary position embedding, Llama/neox layout (rotate halves): Triton kernel and torch
reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import (
    INDEX_DTYPES,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_tensor,
)


def rope_cos_sin(
    head_dim: int, max_positions: int, theta: float, device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Table [max_positions, head_dim]: cos in the first half, sin in the second."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).to(torch.float64) / head_dim)
    )
    t = torch.arange(max_positions, dtype=torch.float64, device=device)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hk, D], positions: [T] int. Returns rotated (q, k)."""
    half = q.shape[-1] // 2
    cs = cos_sin[positions]
    cos = cs[:, :half].unsqueeze(1)
    sin = cs[:, half:].unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, stride_t, stride_h, n_heads, token, cos, sin, half,
    H_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):
    heads = tl.arange(0, H_PAD)[:, None]
    cols = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < n_heads) & (cols < half)
    src = src_ptr + token * stride_t + heads * stride_h + cols
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    # Output is contiguous [T, H, 2*half].
    dst = dst_ptr + token * n_heads * 2 * half + heads * 2 * half + cols
    ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(dst + half, (x2 * cos + x1 * sin).to(ty), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cs_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs, n_q_heads, n_k_heads, half,
    max_positions,
    HQ_PAD: tl.constexpr, HK_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    # An out-of-table position must not read out of bounds: it rotates by zeros instead.
    in_table = (pos >= 0) & (pos < max_positions)
    pos = tl.where(in_table, pos, 0)
    cols = tl.arange(0, HALF_PAD)[None, :]
    cmask = cols < half
    cos = tl.load(cs_ptr + pos * stride_cs + cols, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + half + cols, mask=cmask, other=0.0).to(tl.float32)
    cos = tl.where(in_table, cos, 0.0)
    sin = tl.where(in_table, sin, 0.0)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, n_q_heads, token, cos, sin, half,
                  HQ_PAD, HALF_PAD)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, n_k_heads, token, cos, sin, half,
                  HK_PAD, HALF_PAD)


def _validate(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> None:
    check_tensor("rotary_embedding: positions", positions, 1, INDEX_DTYPES)
    check_tensor("rotary_embedding: q", q, 3)
    check_tensor("rotary_embedding: k", k, 3)
    check_tensor("rotary_embedding: cos_sin", cos_sin, 2)
    check_same_dtype(q=q, k=k)
    check_same_device(positions=positions, q=q, k=k, cos_sin=cos_sin)
    n_tokens, _, head_dim = q.shape
    if k.shape[0] != n_tokens or k.shape[2] != head_dim:
        raise ValueError(
            f"rotary_embedding: q {tuple(q.shape)} and k {tuple(k.shape)} must agree in tokens "
            "and head_dim"
        )
    if positions.shape[0] != n_tokens:
        raise ValueError(
            f"rotary_embedding: positions has {positions.shape[0]} entries for {n_tokens} tokens"
        )
    if head_dim % 2 or cos_sin.shape[1] != head_dim:
        raise ValueError(
            f"rotary_embedding: head_dim {head_dim} must be even and match the cos_sin table "
            f"width {cos_sin.shape[1]}"
        )
    for name, t in (("q", q), ("k", k), ("cos_sin", cos_sin)):
        check_last_dim_contiguous(f"rotary_embedding: {name}", t)


def rotary_embedding_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rotary_embedding_ref; q and k may be strided views of a fused qkv."""
    _validate(positions, q, k, cos_sin)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    n_tokens, n_q_heads, head_dim = q.shape
    if n_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _rotary_kernel[(n_tokens,)](
        positions, q, k, cos_sin, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0),
        n_q_heads, k.shape[1], half, cos_sin.shape[0],
        HQ_PAD=triton.next_power_of_2(n_q_heads), HK_PAD=triton.next_power_of_2(k.shape[1]),
        HALF_PAD=triton.next_power_of_2(half),
    )
    return q_out, k_out
