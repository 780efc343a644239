"""Llama-family forward (llama, mistral, qwen2) over a flattened batch (Orca selective batching).

All scheduled tokens of all requests form one ``[T, hidden]`` tensor: embeddings, norms,
projections and the MLP run on every token at once; only attention is per request, reading each
request's KV through its block table (``kernels.paged_attention``). Hot ops go through
``kernels`` so the Triton versions (#3) slot in without touching this file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from engine.models import cpu_decode_step
from engine.models.rope import build_rope_table


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


class LlamaForCausalLM(nn.Module):
    """``forward`` gives final hidden states for all tokens; ``compute_logits`` is called only
    on the rows that sample (the last token of each request that reaches its end)."""

    def __init__(self, a: LlamaArgs, triton: bool | None = None) -> None:
        """``triton``: force the Triton kernels (True) or the torch references (False); None
        picks by device (kernels.dispatch). Held by each module: no process-wide switch."""
        super().__init__()
        self.args = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(a, triton) for _ in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps, triton)
        self.lm_head = None if a.tie_word_embeddings else nn.Linear(
            a.hidden_size, a.vocab_size, bias=False
        )
        self.cos_sin = torch.empty(0)
        # set by kernels.cpu_linear.route_cpu_linears: the LM head on oneDNN's packed weight
        self.logits_linear: Callable[[torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def from_state_dict(
        cls, a: LlamaArgs, state: dict[str, torch.Tensor], max_positions: int,
        triton: bool | None = None,
    ) -> LlamaForCausalLM:
        """Build on the meta device (no random init of weights we overwrite), then take the
        checkpoint tensors as they are (their dtype and device)."""
        with torch.device("meta"):
            model = cls(a, triton)
        model.load_hf_weights(state)
        if model.embed_tokens.weight.device.type == "cpu":
            model.use_input_major_linear_weights()
        weight = model.embed_tokens.weight
        # fp64 models keep an fp64 table (exact tests); others use fp32, cast per use
        table_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
        model.cos_sin = build_rope_table(a.head_dim, max_positions, a.rope, table_dtype).to(
            weight.device
        )
        return model

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden states [T, hidden] (after the final norm)."""
        x = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        fast = cpu_decode_step.prepare(self, input_ids, positions, kv_caches, meta)
        if fast is not None and fast.stack is not None:  # a few rows: the stack in one call
            return fast.stack.forward(x, fast, kv_caches)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            if fast is not None:  # a step on CPU fp32 past the stack: the ops called directly
                x, residual = cpu_decode_step.layer_forward(
                    layer, fast, x, residual, kv_cache)  # type: ignore[arg-type]
            else:
                x, residual = layer.forward(positions, x, residual, self.cos_sin, kv_cache, meta)
        return self.norm.forward(x, residual)[0]

    def use_input_major_linear_weights(self) -> None:
        """Store each projection's [out, in] weight as a transposed view of an [in, out]
        buffer. Same values and shapes; MKL's sgemm then runs about 2x faster at decode batch
        sizes (M = 4..16: 167 vs 286 us for SmolLM2's gate_up on 2 cores)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.data = module.weight.data.t().contiguous().t()

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int] | None:
        """Each row's argmax of ``compute_logits(hidden)`` (the first maximum), found without
        computing every logit where the head allows it (``kernels.greedy_head``); None: call
        ``compute_logits``."""
        greedy = getattr(self.logits_linear, "greedy_tokens", None)
        return None if greedy is None else cast("list[int] | None", greedy(hidden))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.logits_linear is not None:
            return self.logits_linear(hidden)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)

    def load_hf_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load a HF-named state dict, fusing q/k/v and gate/up; strict about names."""
        ours: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if "rotary_emb" in name or (self.lm_head is None and name == "lm_head.weight"):
                continue
            ours[name.removeprefix("model.")] = tensor
        for i in range(self.args.num_layers):
            _fuse(ours, f"layers.{i}.self_attn.", ("q_proj", "k_proj", "v_proj"), "qkv_proj")
            _fuse(ours, f"layers.{i}.mlp.", ("gate_proj", "up_proj"), "gate_up_proj")
        for key, value in self.state_dict().items():
            if key in ours and ours[key].shape != value.shape:
                raise ValueError(f"{key}: checkpoint {tuple(ours[key].shape)} != {tuple(value.shape)}")
        self.load_state_dict(ours, strict=True, assign=True)
        self.requires_grad_(False)


def _fuse(state: dict[str, torch.Tensor], prefix: str, parts: tuple[str, ...], fused: str) -> None:
    for kind in ("weight", "bias"):
        keys = [f"{prefix}{p}.{kind}" for p in parts]
        if all(k in state for k in keys):
            state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(k) for k in keys], dim=0)
