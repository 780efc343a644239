"""int8 weights for CPU linears (``--quantization int8``): weight-only, one scale per output.

Each weight row is scaled by its largest magnitude to [-127, 127] and rounded; activations stay
fp32. A decode-sized call streams the int8 tiles through the small-batch op
(``kernels.cpu_small_linear.linear_int8``: each weight widened exactly, each output's sum times
its scale), a quarter of fp32's bytes: at 1-2 rows, where a step is bound by reading the
weights, SmolLM2's linears took 0.3-0.45 of fp32's time (2 AVX2 cores). Bigger calls run on
oneDNN with the dequantized weight, packed once: the same numbers up to fp32 rounding.

Why weight-only: torch's dynamic quantization, which this replaced, also rounded each call's
activations to int8 with one scale for the whole batch, so a request's logits depended on its
batch neighbours, and the MLP's down projection (a few huge SiLU-gated channels) could not be
quantized at all. With fp32 activations every linear is int8 and a row's output depends on
that row alone wherever its step runs on the int8 tiles (a step of up to
``kernels.cpu_decode_layers.MAX_TOKENS`` tokens; past it, in a call of more than
``cpu_small_linear.MAX_ROWS`` rows, it is oneDNN's on the dequantized weight, the same numbers up
to fp32 rounding, as fp32's rows there are oneDNN's).
``engine.bench.quality`` prints the agreement with fp32.

Contract: ``quantize(weight [N, K] fp32) -> (q [N, K] int8, scale [N] fp32)`` with
``|weight - q * scale| <= scale / 2`` elementwise; ``Int8Linear(linear)`` replaces an
``nn.Linear`` (forward only) and holds no fp32 copy of its weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu_linear, cpu_small_linear

QMAX = 127  # symmetric: -128 is never used, so q and -q are both representable


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row symmetric int8: ``(q, scale)`` with ``weight ~ q * scale[:, None]``;
    raises on a non-finite weight (its row would round to garbage)."""
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("int8: the weight has non-finite values")
    scale = w.abs().amax(dim=1) / QMAX
    # an all-zero row (or one so small its scale underflows) rounds to zeros at scale 1
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear(nn.Module):
    """An ``nn.Linear`` with int8 weights: calls of up to ``cpu_small_linear.MAX_ROWS`` rows
    on the small-batch op's int8 tiles; bigger ones (prompt chunks, batches past the
    whole-stack op) on oneDNN with the dequantized weight, packed once, as fp32's bigger calls
    run (without oneDNN, ``F.linear`` on it)."""

    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize(weight)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.small = cpu_small_linear.pack_int8(q) if cpu_small_linear.available() else None
        # Why a packed fp32 copy: dequantized a call, a 100-row decode step past the stack
        # rebuilt every weight (425 MB for SmolLM2) and the seed workload ran at 0.67x fp32.
        # int8 tiles plus it are 1.25x one fp32 copy; fp32 keeps two (oneDNN's and the tiles).
        dequantized = _dequantize(q, scale)
        self.packed = cpu_linear.pack(dequantized) if cpu_linear.available(dequantized) else None
        self._dequantized = dequantized if self.packed is None else None
        self._q = q if self.small is None else None

    @classmethod
    def of(cls, src: nn.Linear) -> Int8Linear:
        return cls(src.weight, src.bias)

    def weight(self) -> torch.Tensor:
        """The dequantized [N, K] fp32 weight (``q * scale``)."""
        if self._dequantized is not None:
            return self._dequantized
        if self.small is None:
            assert self._q is not None
            return _dequantize(self._q, self.scale)
        tiles, k, tile = self.small.shape
        q = self.small.transpose(1, 2).reshape(tiles * tile, k)[: self.out_features]
        return _dequantize(q, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and x.dim() == 2 and x.shape[0] <= cpu_small_linear.MAX_ROWS:
            return cpu_small_linear.linear_int8(x if x.stride(1) == 1 else x.contiguous(),
                                                self.small, self.scale, self.bias,
                                                self.out_features)
        if self.packed is not None:
            return cpu_linear.linear(x, self.packed, self.bias)
        return F.linear(x, self.weight(), self.bias)


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.mul(q.to(torch.float32), scale[:, None])
