"""SiLU-and-mul, the gated MLP activation: Triton kernel and torch reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.checks import check_last_dim_contiguous, check_tensor


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2*I] = [gate | up] -> silu(gate) * up, [T, I]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    # fp32 math: the interpreter cannot do bf16 arithmetic and fp16 exp loses range.
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """Same contract as the reference; leading dims are flattened."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("silu_and_mul: x must be a tensor with a last dim of size 2*I")
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim must be even, got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, x.shape[-1])
    check_tensor("silu_and_mul: x", x2, 2)
    check_last_dim_contiguous("silu_and_mul: x", x2)
    n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows and n_cols:
        block = min(1024, triton.next_power_of_2(n_cols))
        grid = (n_rows, triton.cdiv(n_cols, block))
        _silu_and_mul_kernel[grid](x2, out, x2.stride(0), n_cols, BLOCK=block)
    return out.reshape(*x.shape[:-1], n_cols)
