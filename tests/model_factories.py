"""Small model checkpoints for tests: random weights in the Llama family, real tokenizer.

``make_tiny_llama_dir`` writes a HF folder (config.json + model.safetensors + the SmolLM2
tokenizer, so vocab 49152 and a real chat template) that both transformers and our loader read.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from engine.runner.loader import resolve_model_dir

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def smollm2_dir(cache_dir: str | None = None) -> Path:
    """The bundled SmolLM2 converted to safetensors (converted once per cache dir)."""
    return resolve_model_dir(None, cache_dir)


def make_tiny_llama_dir(
    path: Path | str,
    arch: str = "llama",
    seed: int = 0,
    num_layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_position_embeddings: int = 2048,
    rope_theta: float = 10000.0,
    tie_word_embeddings: bool = False,
    initializer_range: float = 0.1,
    tokenizer_dir: Path | None = None,
    **config_overrides: Any,
) -> Path:
    """Save a random ``arch`` ("llama" | "mistral" | "qwen2") checkpoint in ``path``.

    qwen2 has q/k/v biases (initialized non-zero here so tests see them). The larger default
    ``initializer_range`` keeps logits spread out so greedy comparisons are not near-ties.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok_dir = tokenizer_dir if tokenizer_dir is not None else smollm2_dir()
    for name in TOKENIZER_FILES:
        if (tok_dir / name).is_file():
            shutil.copy(tok_dir / name, path / name)
    config = _make_config(
        arch,
        num_hidden_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, initializer_range)  # zero biases would test nothing
            elif "norm" in name:
                param.uniform_(0.5, 1.5)  # non-trivial RMSNorm weights
    model.save_pretrained(str(path))
    return path


def _make_config(arch: str, rope_theta: float, **kwargs: Any) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common: dict[str, Any] = {
        "vocab_size": 49152,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
    }
    common.update(kwargs)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "mistral":
        return MistralConfig(sliding_window=None, **common)
    if arch == "qwen2":
        return Qwen2Config(use_sliding_window=False, **common)
    raise ValueError(f"unknown arch {arch!r}")
