"""RMSNorm and its fused residual-add variant: Triton kernels and torch references."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import (
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Accumulate in fp32 (or fp64 when given fp64), cast back like HF's LlamaRMSNorm.
    dtype = x.dtype
    xf = x.to(torch.float64 if dtype == torch.float64 else torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_res, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to the input dtype first, as the reference's `x + residual` does.
        summed = (x + res).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    # HF casts the normalised row back to the input dtype before scaling by the weight.
    normed = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(
    name: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_tensor(f"{name}: weight", weight, 1)
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"{name}: x must be a tensor [..., hidden]")
    hidden = weight.shape[0]
    check_shape(f"{name}: x", x, (*x.shape[:-1], hidden))
    x2 = check_tensor(f"{name}: x", x.reshape(-1, hidden), 2)
    check_last_dim_contiguous(f"{name}: x", x2)
    check_last_dim_contiguous(f"{name}: weight", weight)
    tensors = {"x": x2, "weight": weight}
    res2 = None
    if residual is not None:
        check_shape(f"{name}: residual", check_tensor(f"{name}: residual", residual, x.dim()),
                    tuple(x.shape))
        res2 = residual.reshape(-1, hidden)
        check_last_dim_contiguous(f"{name}: residual", res2)
        check_same_dtype(x=x2, residual=res2)
        tensors["residual"] = res2
    check_same_device(**tensors)
    n_rows = x2.shape[0]
    out = torch.empty((n_rows, hidden), dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    summed = torch.empty_like(x2) if res2 is not None else None
    if n_rows and hidden:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(n_rows,)](
            x2, res2 if res2 is not None else x2, weight, out,
            summed if summed is not None else out,
            x2.stride(0), res2.stride(0) if res2 is not None else 0, hidden, float(eps),
            HAS_RESIDUAL=res2 is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
        )
    out = out.reshape(x.shape)
    return out, summed.reshape(x.shape) if summed is not None else None


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same contract as rms_norm_ref; x: [..., hidden], weight: [hidden]."""
    return _launch("rms_norm", x, None, weight, eps)[0]


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as fused_add_rms_norm_ref: one pass for the add and the norm."""
    out, summed = _launch("fused_add_rms_norm", x, residual, weight, eps)
    assert summed is not None
    return out, summed
