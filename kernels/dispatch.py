"""The one place that decides Triton or torch reference.

On CUDA tensors the Triton kernel runs; on CPU the reference runs. ``set_use_triton(True)``
forces the Triton path (tests set ``TRITON_INTERPRET=1`` first so it runs on CPU).
The engine calls ``set_use_triton`` once from its config; ``CARPOOL_FORCE_TRITON=1`` is the
environment switch, read here and nowhere else.
"""

from __future__ import annotations

import os

import torch

_force_triton: bool | None = None
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def set_use_triton(value: bool | None) -> None:
    """None = automatic (CUDA -> Triton, CPU -> reference)."""
    global _force_triton
    _force_triton = value


def use_triton(t: torch.Tensor) -> bool:
    """Forced either way by set_use_triton / CARPOOL_FORCE_TRITON=1; otherwise Triton for CUDA
    tensors in a dtype the kernels take (float64 stays on the reference)."""
    if _force_triton is not None:
        return _force_triton
    if os.environ.get("CARPOOL_FORCE_TRITON") == "1":
        return True
    return t.is_cuda and t.dtype in _TRITON_DTYPES
