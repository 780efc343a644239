"""Launch-time validation shared by the Triton wrappers.

A bad launch must fail here, with a message naming the argument, and never reach the kernel:
an out-of-bounds access segfaults under the interpreter and corrupts memory on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(
    name: str,
    t: object,
    ndim: int,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
) -> torch.Tensor:
    """Checks type, rank and dtype; returns t typed as a tensor."""
    if not isinstance(t, torch.Tensor):
        # One exception type for every bad launch, so callers catch one thing.
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")  # noqa: TRY004
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {allowed}")
    return t


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"tensors must be on one device, got {listing}")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise ValueError(f"tensors must share one dtype, got {listing}")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(expected)}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    # Kernels vectorise along the last dim; other dims may be strided (views of a fused qkv).
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dim, got strides {t.stride()}")


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")

