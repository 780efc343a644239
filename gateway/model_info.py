"""What the gateway needs to know about the served model: name, context length, tokenizer.

In one process (``--role all``) it comes from the engine; a gateway-only process loads just
the tokenizer and config from the same model folder (no weights), through the torch-free
``engine.model_files``: importing this module, or ``load_model_info``, never loads torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.model_files import load_tokenizer, model_name, resolve_model_dir
from gateway.config import GatewayConfig

if TYPE_CHECKING:
    from engine.protocol import EngineClient

ECHO_MODEL_NAME = "echo"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int
    tokenizer: Any
    vocab_size: int

    @classmethod
    def from_engine(cls, engine: EngineClient) -> ModelInfo:
        return cls(engine.model_name, engine.max_model_len, engine.tokenizer, len(engine.tokenizer))


def load_model_info(config: GatewayConfig) -> ModelInfo:
    """Tokenizer and limits from the model folder (the bundled SmolLM2 when ``model`` is None)."""
    model_dir = resolve_model_dir(config.model)
    tokenizer = load_tokenizer(model_dir)
    hf = json.loads((model_dir / "config.json").read_text())
    max_len = int(hf.get("max_position_embeddings", 2048))
    cap = config.engine_options.get("max_model_len")
    if cap:
        max_len = min(max_len, int(cap))
    name = ECHO_MODEL_NAME if config.engine == "echo" else model_name(model_dir)
    return ModelInfo(name, max_len, tokenizer, len(tokenizer))

