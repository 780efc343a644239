"""The gateway's tokenization shortcut (the fast tokenizer's own ``encode``) gives the same ids
as the transformers tokenizer it bypasses: plain text, whitespace, unicode, special-token text
and a rendered chat template (the SmolLM2 tokenizer of the tiny test model)."""

from __future__ import annotations

from pathlib import Path

from engine.runner.loader import load_tokenizer
from gateway.http.openai.schema import encode_text

TEXTS = ["The quick brown fox jumps over the lazy dog", "  spaces  and\ttabs\n\n",
         "é ü 中文 🙂", "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>x", "a", ""]


def test_same_ids_as_the_transformers_tokenizer(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello <|im_end|> there"}],
                                   tokenize=False, add_generation_prompt=True)
    for text in [*TEXTS, chat]:
        assert encode_text(tok, text) == list(tok.encode(text, add_special_tokens=False)), text
    assert len(encode_text(tok, chat)) > 5
