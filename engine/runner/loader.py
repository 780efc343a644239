"""Read a local checkpoint's config and weights (torch), and convert the bundled GGUF once.

Finding the folder and loading the tokenizer need no torch and live in
``engine.model_files`` (re-exported here); a gateway-only process uses that module alone.
Never reaches a hub: every transformers load here passes ``local_files_only=True`` (no
process environment is changed to get there).

The bundled SmolLM2-135M-Instruct is a Q4_1 GGUF; transformers dequantizes it in ~15 s, so
``convert_gguf`` does that once and keeps a plain safetensors folder in a cache directory;
later starts read that folder in well under a second. Any local HF checkpoint of the Llama
family (llama, mistral, qwen2) loads as is.
"""

from __future__ import annotations

import json
import shutil
import tempfile
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


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF once with transformers and write a safetensors HF folder at ``target``.

    Written into a temp folder beside ``target`` and renamed into place, so concurrent
    processes never see a half-written folder; the loser of a race drops its copy.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one-time conversion; keep the terminal quiet

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        src, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            src, gguf_file=name, local_files_only=True, dtype=torch.float32
        )
        config = model.config.to_dict()
        for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
            config.pop(key, None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        state = model.state_dict()
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)  # shared storage; safetensors refuses aliases
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(str(tmp))
        GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        ).save_pretrained(str(tmp))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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
