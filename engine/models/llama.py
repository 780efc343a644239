"""Llama-family forward (llama, mistral, qwen2) over a flattened batch (Orca selective batching).

All scheduled tokens of all requests form one ``[T, hidden]`` tensor: embeddings, norms,
projections and the MLP run on every token at once; only attention is per request, reading each
request's KV through its block table (``kernels.paged_attention``). The layers are
``engine.models.llama_layers``; on CPU fp32 a step may take the C++ fast path instead
(``engine.models.cpu_decode_step``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.models import cpu_decode_step
from engine.models.llama_layers import AttentionMetadata, LlamaArgs, LlamaDecoderLayer, RMSNorm
from engine.models.rope import build_rope_table


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
