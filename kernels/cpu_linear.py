"""fp32 CPU linears: oneDNN's inner product with pre-packed weights, and for decode-sized
batches (at most ``kernels.cpu_small_linear.MAX_ROWS`` rows) the small-batch op, which streams
its own packed copy of the weight near memory bandwidth (2x oneDNN at 1-8 rows; docs/benchmarks.md,
"carpool bench engine"). Both copies are kept: a prefill chunk of hundreds of rows is oneDNN's.

Contract: ``route_cpu_linears(model)`` replaces every plain ``nn.Linear`` of ``model`` whose
weight is float32 on CPU by a ``OneDNNLinear`` holding the weight packed once by
``torch.ops.mkldnn._reorder_linear_weight`` (what Inductor's CPU path does), and gives a tied or
untied LM head the same packed op through ``model.logits_linear`` (unless the model has one of
its own already: int8's); it returns how many linears it routed. Outputs equal ``F.linear`` to
fp32 rounding (a different summation order), not bit for bit. Without the small-batch op built,
every row count takes oneDNN. Nothing changes (F.linear stays) for float64 (the
transformers-equality tests), other devices, int8 modules (``engine.runner.quantize``: no
longer ``nn.Linear``; they run their own int8 op) and a torch without oneDNN. Why: torch's fp32 ``F.linear`` (MKL sgemv/sgemm) runs small M on one thread; oneDNN
uses every thread and packed weights stream faster (SmolLM2's LM head at M=8 on 2 cores:
16.1 ms -> 4.2 ms).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import cpu_small_linear
from kernels.greedy_head import ScreenedHead

# Batch-size hint for packing: oneDNN picks the blocked layout for this M; any M runs on it.
PACK_HINT_M = 8


def available(weight: torch.Tensor) -> bool:
    """True where the oneDNN route applies to this weight (fp32, CPU, oneDNN built in)."""
    return (
        weight.dtype == torch.float32 and weight.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack(weight: torch.Tensor, hint_m: int = PACK_HINT_M) -> torch.Tensor:
    """[out, in] weight -> oneDNN's packed copy (opaque layout; only ``linear`` reads it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), hint_m)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the packed weight; x is [..., in] fp32."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class OneDNNLinear(nn.Module):
    """An ``nn.Linear`` whose weight lives packed; forward only (no autograd use here)."""

    packed: torch.Tensor

    def __init__(self, src: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = src.in_features, src.out_features
        self.register_buffer("packed", pack(src.weight))
        self.small = small_pack(src.weight)
        self.bias = None if src.bias is None else src.bias.detach().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return route(x, self.packed, self.small, self.bias, self.out_features)


class PackedHead:
    """The LM head as a callable (not a module, so profilers that time ``compute_logits`` do
    not count it twice); packs a copy even when the weight is tied to the embeddings.
    ``greedy_tokens`` gives the argmax of a few rows' logits without computing them all
    (``kernels.greedy_head``), or None where that does not apply."""

    def __init__(self, packed: torch.Tensor, small: torch.Tensor | None, out_features: int,
                 screen: ScreenedHead | None = None) -> None:
        self.packed, self.small, self.out_features = packed, small, out_features
        self.screen = screen

    @classmethod
    def of(cls, weight: torch.Tensor, small: torch.Tensor | None = None,
           packed: torch.Tensor | None = None) -> PackedHead:
        small = small_pack(weight) if small is None else small
        return cls(pack(weight) if packed is None else packed, small, weight.shape[0],
                   ScreenedHead.of(weight, small))

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return route(hidden, self.packed, self.small, None, self.out_features)

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int] | None:
        return None if self.screen is None else self.screen.tokens(hidden)


def small_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The small-batch op's copy of an [out, in] weight; None when that op is not built."""
    return cpu_small_linear.pack(weight) if cpu_small_linear.available() else None


def route(x: torch.Tensor, packed: torch.Tensor, small: torch.Tensor | None,
          bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """A few rows to the small-batch op, more to oneDNN."""
    if small is not None and x.dim() == 2 and x.shape[0] <= cpu_small_linear.MAX_ROWS:
        return cpu_small_linear.linear(x if x.stride(1) == 1 else x.contiguous(), small, bias,
                                       out_features)
    return linear(x, packed, bias)


def route_cpu_linears(model: nn.Module) -> int:
    """Swap the model's fp32 CPU ``nn.Linear`` modules (and its LM head) to oneDNN."""
    routed = 0
    lm_head = getattr(model, "lm_head", None)
    head_weight = lm_head.weight if type(lm_head) is nn.Linear else None
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and available(child.weight):
                setattr(parent, name, OneDNNLinear(child))
                routed += 1
    head = getattr(model, "lm_head", None)
    embed = getattr(model, "embed_tokens", None)
    if getattr(model, "logits_linear", None) is not None:
        pass  # a head of its own already (int8: ``engine.runner.quantize``)
    elif isinstance(head, OneDNNLinear) and head.bias is None and head_weight is not None:
        model.logits_linear = PackedHead.of(  # type: ignore[assignment]
            head_weight, head.small, head.packed)
    elif head is None and embed is not None and available(embed.weight):
        # packed copies of the tied table (the embedding lookup keeps the plain one)
        model.logits_linear = PackedHead.of(embed.weight)  # type: ignore[assignment]
    return routed
