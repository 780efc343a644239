"""Incremental detokenization for streaming.

Decoding token by token is wrong in two ways: a character may span several byte-level tokens
(each alone decodes to U+FFFD), and some tokenizers render a token differently depending on its
left neighbour (sentencepiece's leading space). So, like vLLM, we decode a short window
``[prefix_offset:]`` and emit only what it adds beyond ``[prefix_offset:read_offset]``, and we
hold text back while it ends in U+FFFD (an incomplete character).
"""

from __future__ import annotations

from typing import Any

_CONTEXT_TOKENS = 5  # prompt tokens kept as left context for the first output token
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._first_read_offset = self._read_offset

    def add(self, token_ids: list[int]) -> str:
        """Append output tokens; return the newly stable text (possibly "")."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of a request: whatever was held back (may contain U+FFFD)."""
        return self._advance(final=True)

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids[self._first_read_offset :]

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if new_text.endswith(_REPLACEMENT) and not final:
            return ""  # an incomplete character: wait for the rest of its bytes
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta
