"""Logprobs in OpenAI's two shapes, from the ids and floats the worker sends.

On the bus a token's logprobs are ``[logprob, [[id, logprob], ...]]`` (the sampled token's,
then the best alternatives); its id travels in ``TokenMsg.token_ids``. Here they become:

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}]}``;
- completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
  "text_offset"}``, offsets counted in characters from the start of the completion.

A token's text is its own bytes decoded (U+FFFD for a part of a character); ``bytes`` are the
token's exact bytes (for byte-level BPE read through the byte alphabet, so a token holding
half of an emoji still reports its real bytes).
"""

from __future__ import annotations

import functools
from typing import Any

# vLLM clamps -inf (a token that could not be picked) to this so that the JSON stays valid
_FLOOR = -9999.0


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted: the alphabet byte-level BPE spells bytes in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenText:
    """A token id's text and bytes for one tokenizer (cached per id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._lookup(token_id)
        return hit

    def _lookup(self, token_id: int) -> tuple[str, list[int]]:
        if self._byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            table = _byte_decoder()
            if isinstance(piece, str) and all(c in table for c in piece):
                raw = bytes(table[c] for c in piece)
                return raw.decode("utf-8", errors="replace"), list(raw)
        text = str(self.tokenizer.decode([token_id]))
        return text, list(text.encode("utf-8"))


@functools.lru_cache(maxsize=4)
def token_text(tokenizer: Any) -> TokenText:
    """The process's one ``TokenText`` per tokenizer (its cache outlives requests)."""
    return TokenText(tokenizer)


def _lp(value: float) -> float:
    return max(value, _FLOOR)


def chat_logprobs(texts: TokenText, ids: list[int], lps: list[Any]) -> dict[str, Any]:
    content = []
    for token_id, (logprob, top) in zip(ids, lps, strict=True):
        text, raw = texts.get(token_id)
        alts = []
        for alt_id, alt_lp in top:
            alt_text, alt_raw = texts.get(alt_id)
            alts.append({"token": alt_text, "logprob": _lp(alt_lp), "bytes": alt_raw})
        content.append({"token": text, "logprob": _lp(logprob), "bytes": raw,
                        "top_logprobs": alts})
    return {"content": content, "refusal": None}


def completion_logprobs(texts: TokenText, ids: list[int], lps: list[Any],
                        offset: int = 0) -> dict[str, Any]:
    """The legacy shape; ``offset``: characters of completion text before these tokens."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for token_id, (logprob, top) in zip(ids, lps, strict=True):
        text, _ = texts.get(token_id)
        tokens.append(text)
        token_lps.append(_lp(logprob))
        tops.append({texts.get(a)[0]: _lp(v) for a, v in top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}
