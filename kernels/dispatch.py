"""The one place that decides Triton or torch reference.

On CUDA tensors the Triton kernel runs; on CPU the reference runs. A caller may force either
path per call (``force``): the model passes its engine config's ``use_triton``, so two engines
in one process never change each other's choice (tests set ``TRITON_INTERPRET=1`` first so
the forced Triton path runs on CPU). No environment is read here: ``CARPOOL_FORCE_TRITON=1``
is read once, into ``EngineConfig.use_triton`` (engine.core.config).
"""

from __future__ import annotations

import torch

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def use_triton(t: torch.Tensor, force: bool | None = None) -> bool:
    """Forced either way by ``force``; otherwise (None) Triton for CUDA tensors in a dtype
    the kernels take (float64 stays on the reference)."""
    if force is not None:
        return force
    return t.is_cuda and t.dtype in _TRITON_DTYPES
