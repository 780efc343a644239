"""The streaming fast path builds the same bytes as the full chunk builder, for chat and
text completions and for text that needs JSON escaping."""

from __future__ import annotations

import json

import pytest

from gateway.http.openai.format import Formatter

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
