"""Convert the bundled GGUF once into a safetensors HF folder (torch, transformers).

The bundled SmolLM2-135M-Instruct is a Q4_1 GGUF; transformers dequantizes it in ~15 s, so
``convert_gguf`` does that once and keeps a plain safetensors folder in a cache directory
(``engine.model_files.resolve_model_dir`` calls it, on a fresh thread, when the folder is
missing). Never reaches a hub: every transformers load passes ``local_files_only=True``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch


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
