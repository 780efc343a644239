"""SiLU-and-mul, the gated MLP activation: torch reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2*I] = [gate | up] -> silu(gate) * up, [T, I]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
