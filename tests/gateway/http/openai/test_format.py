"""The streaming fast path builds the same bytes as the full chunk builder, for chat and
text completions and for text that needs JSON escaping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.runner.loader import load_tokenizer
from gateway.bus.messages import TokenMsg
from gateway.http.openai.format import Formatter
from gateway.http.openai.logprobs import TokenText

TEXTS = ["a", "", " the", 'quote " back \\ slash', "line\nbreak\ttab", "é ü 中文 🙂", "\x00x"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_text_chunk_is_chunk(kind: str) -> None:
    fmt = Formatter(kind, "cmpl-abc", 'model "q"', 1700000000, "batch")
    for text in TEXTS:
        fast = fmt.text_chunk(text)
        assert fast == fmt.chunk(text)
        body = json.loads(fast.removeprefix(b"data: ").removesuffix(b"\n\n"))
        choice = body["choices"][0]
        assert (choice["delta"]["content"] if kind == "chat" else choice["text"]) == text


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_full_body_with_logprobs_asked_but_none_sent(kind: str, tiny_model_dir: Path) -> None:
    """An engine that makes no logprobs (the echo engine) sends messages without them: the
    full body is the streamed one's shape (no logprob entries), not a misaligned zip (a 500)."""
    texts = TokenText(load_tokenizer(tiny_model_dir))
    fmt = Formatter(kind, "cmpl-abc", "m", 1700000000, "batch", texts)
    msgs = [TokenMsg([17, 400], "ab"), TokenMsg([31], "c")]
    choice = fmt.full(msgs, "length", 3, 3)["choices"][0]
    entries = choice["logprobs"]["content" if kind == "chat" else "tokens"]
    assert entries == []
    assert (choice["message"]["content"] if kind == "chat" else choice["text"]) == "abc"
