"""The layers of the Llama family (llama, mistral, qwen2): attention, MLP, RMSNorm and the decoder
layer, with the dimensions read from a transformers config (``LlamaArgs``) and the per-step
metadata attention reads (``AttentionMetadata``). The model that stacks them is
``engine.models.llama``.

Every layer runs on the flattened ``[T, hidden]`` batch; only attention is per request, reading
each request's KV through its block table (``kernels.paged_attention``). Hot ops go through
``kernels``, so the Triton kernel or the torch reference runs by device (``kernels.dispatch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import kernels


@dataclass
class AttentionMetadata:
    """Per-step tensors attention needs; built once per step by the runner."""

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    block_tables: torch.Tensor  # [R, max_blocks] int32
    seq_lens: torch.Tensor  # [R] int32: context length incl. this step's tokens
    query_start_loc: torch.Tensor  # [R+1] int32: request r owns rows [qsl[r], qsl[r+1])


@dataclass(frozen=True)
class LlamaArgs:
    """The dimensions we need, read from a transformers config of the Llama family."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope: dict[str, Any]
    sliding_window: int | None

    @classmethod
    def from_hf(cls, config: Any) -> LlamaArgs:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r} (only silu)")
        window = getattr(config, "sliding_window", None)
        if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
            window = None
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            max_position_embeddings=config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=config.model_type == "qwen2" or attention_bias,
            o_bias=attention_bias,  # llama's attention_bias covers o_proj too; qwen2's does not
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            rope=_rope_parameters(config),
            sliding_window=window,
        )


def _rope_parameters(config: Any) -> dict[str, Any]:
    # transformers 5 keeps rope_theta and scaling together in rope_parameters; 4.x split them.
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    out = dict(getattr(config, "rope_scaling", None) or {})
    out.setdefault("rope_type", out.pop("type", "default"))
    out["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return out


class LlamaAttention(nn.Module):
    def __init__(self, a: LlamaArgs, triton: bool | None = None) -> None:
        super().__init__()
        self.triton = triton
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.q_size, self.kv_size = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        self.scale = a.head_dim**-0.5
        # q, k and v in one matmul: one weight read, one kernel launch
        self.qkv_proj = nn.Linear(a.hidden_size, self.q_size + 2 * self.kv_size, bias=a.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, a.hidden_size, bias=a.o_bias)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, cos_sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        # one view of [q | k | v] as heads, split into three views (heads are contiguous)
        heads = [self.num_heads, self.num_kv_heads, self.num_kv_heads]
        q, k, v = self.qkv_proj(x).view(t, sum(heads), self.head_dim).split(heads, 1)
        q, k = kernels.rotary_embedding(positions, q, k, cos_sin, self.triton)
        k_cache, v_cache = kv_cache
        kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, self.triton)
        o = kernels.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
            self.scale, self.triton,
        )
        return self.o_proj(o.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, a: LlamaArgs, triton: bool | None = None) -> None:
        super().__init__()
        self.triton = triton
        # gate and up in one matmul; silu_and_mul splits [gate | up]
        self.gate_up_proj = nn.Linear(a.hidden_size, 2 * a.intermediate_size, bias=a.mlp_bias)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=a.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(x), self.triton))


class RMSNorm(nn.Module):
    """Holds the weight; the math is ``kernels.rms_norm`` / ``fused_add_rms_norm``."""

    def __init__(self, size: int, eps: float, triton: bool | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.triton = triton

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); with no residual yet, x is it."""
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps, self.triton), x
        return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps, self.triton)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, a: LlamaArgs, triton: bool | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, triton)
        self.self_attn = LlamaAttention(a, triton)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps, triton)
        self.mlp = LlamaMLP(a, triton)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
        cos_sin: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # norms, attention and MLP: ``forward`` called directly (``Module.__call__``'s hook
        # checks cost ~0.8 us a call, 150 a step; nothing hooks them). The linears keep
        # ``__call__``: forward hooks on them work (tests/engine/bench/test_ceiling.py)
        h, residual = self.input_layernorm.forward(x, residual)
        h = self.self_attn.forward(positions, h, cos_sin, kv_cache, meta)
        h, residual = self.post_attention_layernorm.forward(h, residual)
        return self.mlp.forward(h), residual
