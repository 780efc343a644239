"""Read a local checkpoint's config and weights (torch).

Finding the folder and loading the tokenizer need no torch and live in
``engine.model_files`` (re-exported here); a gateway-only process uses that module alone.
Never reaches a hub: every transformers load here passes ``local_files_only=True`` (no
process environment is changed to get there).

The bundled SmolLM2-135M-Instruct is a Q4_1 GGUF, converted once into a plain safetensors
folder (``engine.runner.gguf_convert``, which ``engine.model_files`` calls); later starts read
that folder in well under a second. Any local HF checkpoint of the Llama family (llama,
mistral, qwen2) loads as is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Re-exported: the torch-free half, for callers that import it from here.
from engine.model_files import (  # noqa: F401
    BUNDLED_GGUF,
    BUNDLED_NAME,
    BUNDLED_PACKAGE,
    bundled_gguf_path,
    default_cache_dir,
    load_tokenizer,
    model_name,
    resolve_model_dir,
)

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")


def load_hf_config(model_dir: Path) -> Any:
    """transformers config of a local checkpoint; rejects architectures we do not implement."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    if config.model_type not in SUPPORTED_ARCHS:
        raise ValueError(
            f"unsupported model_type {config.model_type!r}; supported: {SUPPORTED_ARCHS}"
        )
    return config


def eos_token_ids(model_dir: Path, tokenizer: Any, hf_config: Any) -> list[int]:
    """All end-of-sequence ids: the tokenizer's, the config's and generation_config's."""
    ids: list[int] = []
    sources: list[Any] = [tokenizer.eos_token_id, getattr(hf_config, "eos_token_id", None)]
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for src in sources:
        for tid in src if isinstance(src, list) else [src]:
            if tid is not None and int(tid) not in ids:
                ids.append(int(tid))
    return ids


def load_state_dict(model_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files (sharded or not), cast to ``dtype``."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir} (only safetensors is supported)")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                state[key] = f.get_tensor(key).to(dtype)
    return state
