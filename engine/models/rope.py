"""The rotary cos/sin table for a checkpoint's rope parameters (default, linear, llama3).

Default rope is ``kernels.rope_cos_sin``; the scaled variants only change the inverse
frequencies (same formulas as transformers' ``_compute_*_parameters``), so they build the same
``[max_positions, head_dim]`` table (cos | sin) that ``kernels.rotary_embedding`` consumes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import kernels

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def build_rope_table(
    head_dim: int, max_positions: int, rope: dict[str, Any], dtype: torch.dtype
) -> torch.Tensor:
    rope_type = rope.get("rope_type", "default")
    theta = float(rope.get("rope_theta", 10000.0))
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return kernels.rope_cos_sin(head_dim, max_positions, theta, dtype=dtype)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if rope_type == "linear":
        inv_freq = inv_freq / float(rope["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope)
    else:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}"
        )
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth ramp between.
    factor = float(rope["factor"])
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    old_len = float(rope["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)
