"""A decode step's decoder layer on CPU fp32, calling the C++ ops directly.

Why: at one decoding row a layer's norms, rotary, KV write, attention and SiLU-mul are each
well under a microsecond of C++ work, but going through ``kernels``' per-call dispatch (the
Triton/op/reference checks on every tensor, the metadata converted again in every layer, the
attention's ragged-batch bookkeeping) cost ~40 us a layer, ~1.5 ms of an ~18 ms step. Here the
checks and conversions run once per step (``prepare``) and every layer calls the same ops
(``kernels.cpu_layer_ops``, ``kernels.cpu_decode``) with them.

Contract: ``prepare(model, input_ids, positions, kv_caches, meta)`` returns a ``CpuDecodeStep``
only when the step can take this path: fp32 CPU weights, fp32 or fp16 caches (contiguous), the C++ ops
built, Triton not forced, and, past the stack's tokens, its prompt tokens' contexts within
``MAX_PROMPT_READS`` (a pure decode step has none); otherwise None and the model runs its
general path. In a step with prompt tokens each token attends as a decode row of its own: its
request's block table, context = its position + 1 (the step writes every new token's K and V
before any attention reads, so that is causal attention over the cached prefix and the chunk);
a prompt of a few tokens then costs its linears on the small-batch op and no SDPA setup (a
35-token prompt step: ~100-160 ms on the general path, 2 AVX2 cores, most of it OpenMP wakes
under PASSIVE). On a pure decode step ``layer_forward`` gives the same bits as
``LlamaDecoderLayer.forward``: the same ops on the same tensors in the same order; with prompt
tokens, SDPA's numbers up to rounding (tests/engine/models/test_cpu_decode_step.py). Its
``stack`` is the whole decoder stack in one C++ call (``kernels.cpu_decode_layers``, the same
ops again, so the same bits) where the model's linears have the small-batch op's weights and
the step has at most ``kernels.cpu_decode_layers.MAX_TOKENS`` tokens; the model then runs
``stack.forward`` instead of its layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, cast

import torch
from torch import nn

from engine.models.llama_layers import AttentionMetadata, LlamaDecoderLayer, RMSNorm
from kernels import cpu_decode, cpu_decode_layers, cpu_layer_ops
from kernels.cpu_decode_layers import DecodeLayers, LayerWeights, SmallLinear
from kernels.cpu_int8_linear import Int8Linear
from kernels.cpu_linear import OneDNNLinear


class DecoderModel(Protocol):
    """What this path reads of the model (``engine.models.llama.LlamaForCausalLM``, which
    calls it from its forward)."""

    embed_tokens: nn.Embedding
    layers: nn.ModuleList
    norm: RMSNorm
    cos_sin: torch.Tensor


# Past the stack's tokens, a step's prompt tokens attend as decode rows while the context they
# read, summed over them, stays within this: the in-place decode op beat SDPA's general path at
# every chunk measured, one request's chunk of L tokens ending at context C (2 AVX2 cores, one
# layer): L = C = 8: 0.014 vs 0.83 ms; 64: 0.27 vs 2.1; 512: 7.2 vs 24; 2048 (2.1M reads): 95
# vs 355; L 256, C 4096 (1.0M): 49 vs 85; L 128, C 1024: 6.7 vs 7.9. The limit is twice the
# largest read measured, where the op still won 3.7x. Many short prompts gain most: seed 000's
# first step (100 prompts, 512 tokens) spent 2.3-2.7 of its 3.3-3.7 s in SDPA's per-request
# calls.
MAX_PROMPT_READS = 1 << 22


@dataclass(frozen=True)
class CpuDecodeStep:
    layer_ops: ModuleType
    decode_op: ModuleType
    positions: torch.Tensor  # [R] int64
    slots: torch.Tensor  # [R] int64
    block_tables: torch.Tensor  # [R, max_blocks] int32
    seq_lens: torch.Tensor  # [R] int32
    cos_sin: torch.Tensor
    stack: DecodeLayers | None = None


def stack_for(model: DecoderModel) -> DecodeLayers | None:
    """The model's whole-stack op, bound to its weights on first use; None where it does not
    apply (linears not on the small-batch op, the op not built)."""
    # keyed on the first and last linear modules: routing or quantizing swaps them, and a stack
    # bound to the old ones would run the old weights
    layers = model.layers
    key = (id(getattr(layers[0].self_attn, "qkv_proj", None)),
           id(getattr(layers[-1].mlp, "down_proj", None))) if len(layers) else None
    cached = model.__dict__.get("_decode_layers")
    if cached is None or cached[0] != key:
        cached = model.__dict__["_decode_layers"] = (key, _bind(model))
    stack: DecodeLayers | None = cached[1]
    return stack


def _small(linear: nn.Module) -> SmallLinear | None:
    if isinstance(linear, Int8Linear) and linear.small is not None:
        return SmallLinear(linear.small, linear.bias, linear.out_features, linear.scale)
    if not isinstance(linear, OneDNNLinear) or linear.small is None:
        return None  # float64, or the small-batch op not built
    return SmallLinear(linear.small, linear.bias, linear.out_features)


def _bind(model: DecoderModel) -> DecodeLayers | None:
    if not cpu_decode_layers.available() or not model.layers:
        return None
    layers = []
    for layer in cast("list[LlamaDecoderLayer]", list(model.layers)):
        attn, mlp = layer.self_attn, layer.mlp
        linears = [_small(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        qkv, o, gate_up, down = linears
        if qkv is None or o is None or gate_up is None or down is None:
            return None
        norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
        layers.append(LayerWeights(norm1.weight, float(norm1.eps), qkv, o, norm2.weight,
                                   float(norm2.eps), gate_up, down))
    attn = cast("LlamaDecoderLayer", model.layers[0]).self_attn
    return DecodeLayers(layers, model.norm.weight, float(model.norm.eps), model.cos_sin,
                        attn.num_heads, attn.num_kv_heads, attn.head_dim, float(attn.scale))


def prepare(
    model: DecoderModel, input_ids: torch.Tensor, positions: torch.Tensor,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
) -> CpuDecodeStep | None:
    layer_ops, decode_op = cpu_layer_ops.OPS.module(), cpu_decode.OPS.module()
    if layer_ops is None or decode_op is None or not kv_caches or not model.layers:
        return None
    weight, cache = model.embed_tokens.weight, kv_caches[0][0]
    forced = getattr(model.layers[0].self_attn, "triton", None) is True
    tokens, rows = input_ids.shape[0], meta.seq_lens.shape[0]
    if (weight.dtype != torch.float32 or weight.device.type != "cpu"
            or cache.dtype not in cpu_decode.CACHE_DTYPES or not cache.is_contiguous() or forced):
        return None
    stack = stack_for(model) if tokens <= cpu_decode_layers.MAX_TOKENS else None
    block_tables, seq_lens = meta.block_tables, meta.seq_lens
    if tokens != rows:  # prompt tokens: each attends as a decode row of its own (see above)
        counts = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).to(torch.int64)
        seq_lens = positions + 1
        if stack is None and _prompt_reads(seq_lens, counts) > MAX_PROMPT_READS:
            return None  # long chunks deep in long contexts: SDPA's path
        block_tables = block_tables.repeat_interleave(counts, 0)
    return CpuDecodeStep(
        layer_ops, decode_op, positions.to(torch.int64).contiguous(),
        meta.slot_mapping.to(torch.int64).contiguous(),
        block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous(),
        model.cos_sin.contiguous(), stack,
    )


def _prompt_reads(seq_lens: torch.Tensor, counts: torch.Tensor) -> int:
    """The context the step's prompt tokens read, summed (a decode row's is not counted):
    ``seq_lens`` per token, ``counts`` tokens per row."""
    prompt = (counts > 1).repeat_interleave(counts)
    return int(seq_lens[prompt].sum())


def layer_forward(
    layer: LlamaDecoderLayer, step: CpuDecodeStep, x: torch.Tensor,
    residual: torch.Tensor | None, kv_cache: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    ops, attn, mlp = step.layer_ops, layer.self_attn, layer.mlp
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    if residual is None:
        h, residual = ops.rms_norm(x, norm1.weight, float(norm1.eps)), x
    else:
        h, residual = ops.add_rms_norm(x, residual, norm1.weight, float(norm1.eps))
    t = h.shape[0]
    heads = [attn.num_heads, attn.num_kv_heads, attn.num_kv_heads]
    q, k, v = attn.qkv_proj(h).view(t, sum(heads), attn.head_dim).split(heads, 1)
    q, k = ops.rotary(step.positions, q, k, step.cos_sin)
    k_cache, v_cache = kv_cache
    ops.write_kv(k, v, k_cache, v_cache, step.slots)
    o = step.decode_op.paged_decode(q, k_cache, v_cache, step.block_tables, step.seq_lens,
                                    float(attn.scale))
    h, residual = ops.add_rms_norm(attn.o_proj(o.reshape(t, attn.q_size)), residual,
                                   norm2.weight, float(norm2.eps))
    return mlp.down_proj(ops.silu_mul(mlp.gate_up_proj(h))), residual
