"""Opt-in int8 weights on CPU (``quantization="int8"``): every decoder layer's linear becomes
torch's dynamic-quantized linear (int8 weights, per-output-channel scales; activations
quantized per call; fbgemm/oneDNN int8 GEMMs), as llama.cpp serves quantized weights.

Embeddings, norms and the LM head (tied to the embeddings in SmolLM2) stay fp32. It is lossy:
``engine.bench.quality`` checks a quantized engine against fp32 (top-1 agreement over a fixed
prompt set and the perplexity delta). fp32 stays the default and the reference.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace the ``nn.Linear`` modules under ``model.layers`` in place; returns ``model``."""
    from torch.ao.quantization import quantize_dynamic

    engines = torch.backends.quantized.supported_engines
    torch.backends.quantized.engine = "fbgemm" if "fbgemm" in engines else engines[-1]
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        for layer in model.layers:  # type: ignore[union-attr]
            quantize_dynamic(layer, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model
