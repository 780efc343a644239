"""Opt-in int8 weights on CPU (``quantization="int8"``): every decoder layer's linears become
``kernels.cpu_int8_linear.Int8Linear`` (weight-only int8, one scale per output channel,
activations fp32), as llama.cpp serves quantized weights.

Embeddings, norms and the LM head (tied to the embeddings in SmolLM2) stay fp32. It is lossy:
``engine.bench.quality`` checks a quantized engine against fp32 (top-1 agreement over a fixed
prompt set and the perplexity delta). fp32 stays the default and the reference.
"""

from __future__ import annotations

from torch import nn

from kernels.cpu_int8_linear import Int8Linear


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace the layers' ``nn.Linear`` modules in place; returns the model."""
    for layer in model.layers:  # type: ignore[union-attr]
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Int8Linear(child))
    return model
