"""Opt-in int8 weights on CPU (``quantization="int8"``): every decoder layer's linears become
``kernels.cpu_int8_linear.Int8Linear`` (weight-only int8, one scale per output channel,
activations fp32), and so does the LM head (tied to the embeddings in SmolLM2: its logits read
an int8 copy, the embedding lookup the fp32 table), as llama.cpp's Q8_0 quantizes its output
weight. Norms stay fp32. It is lossy:
``engine.bench.quality`` checks a quantized engine against fp32 (top-1 agreement over a fixed
prompt set and the perplexity delta). fp32 stays the default and the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from kernels.cpu_int8_linear import Int8Linear

if TYPE_CHECKING:
    from engine.models.llama import LlamaForCausalLM


def quantize_int8(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """Replace the layers' ``nn.Linear`` modules and the LM head in place; returns the model."""
    for layer in model.layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Int8Linear.of(child))
    head = model.lm_head if model.lm_head is not None else model.embed_tokens
    int8_head = Int8Linear(head.weight, getattr(head, "bias", None))
    model.lm_head = None  # untied: no fp32 head left for the routing to pack
    model.logits_linear = int8_head
    return model
