"""OpenAI response bodies and stream chunks for chat and text completions.

With logprobs asked for (the ``Formatter`` got a ``TokenText``), every body and chunk that
carries text carries the logprobs of the tokens it covers (``openai/logprobs.py`` shapes
them); ``usage.prompt_tokens_details.cached_tokens`` reports prefix-cache hits when the
worker told them.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.http.openai.logprobs import TokenText, chat_logprobs, completion_logprobs


def usage(prompt_tokens: int, completion_tokens: int,
          cached_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


# Stands for the text in a chunk built once per request; only the text changes between chunks.
_TEXT_MARK = "\x00carpool-text\x00"


class Formatter:
    """Builds bodies for one request (chat or completion)."""

    def __init__(self, kind: str, request_id: str, model: str, created: int,
                 service_tier: str, texts: TokenText | None = None) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created
        self.tier = service_tier
        self.texts = texts  # set: the request asked for logprobs
        self._text_frame: tuple[bytes, bytes] | None = None
        self._offset = 0  # completions' text_offset: characters of tokens already streamed

    def _logprobs(self, ids: list[int], lps: list[Any]) -> dict[str, Any] | None:
        if self.texts is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(self.texts, ids, lps)
        body = completion_logprobs(self.texts, ids, lps, self._offset)
        self._offset += sum(len(t) for t in body["tokens"])
        return body

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model, "service_tier": self.tier}

    def full(self, text: str, finish_reason: str, prompt_tokens: int,
             completion_tokens: int, token_ids: list[int] | None = None,
             logprobs: list[Any] | None = None, cached_tokens: int | None = None
             ) -> dict[str, Any]:
        reason = str(finish_reason)  # a FinishReason: OpenAI spells stop and length alike
        lps = self._logprobs(token_ids or [], logprobs or [])
        if self.kind == "chat":
            body = self._base("chat.completion")
            body["choices"] = [{"index": 0, "finish_reason": reason, "logprobs": lps,
                                "message": {"role": "assistant", "content": text}}]
        else:
            body = self._base("text_completion")
            body["choices"] = [{"index": 0, "text": text, "finish_reason": reason,
                                "logprobs": lps}]
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body

    def delta(self, text: str, token_ids: list[int], logprobs: list[Any]) -> bytes:
        """A chunk with ``text`` and, when asked for, the logprobs of ``token_ids``."""
        if self.texts is None:
            return self.text_chunk(text)
        return self.chunk(text, logprobs=self._logprobs(token_ids, logprobs))

    def chunk(self, text: str | None, finish_reason: str | None = None,
              first: bool = False, logprobs: dict[str, Any] | None = None) -> bytes:
        reason = str(finish_reason) if finish_reason else None
        if self.kind == "chat":
            body = self._base("chat.completion.chunk")
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            body["choices"] = [{"index": 0, "delta": delta, "finish_reason": reason,
                                "logprobs": logprobs}]
        else:
            body = self._base("text_completion")
            body["choices"] = [{"index": 0, "text": text or "", "finish_reason": reason,
                                "logprobs": logprobs}]
        return sse(body)

    def text_chunk(self, text: str) -> bytes:
        """``chunk(text)``, byte for byte, without rebuilding the whole body: the SSE event
        around the text is made once per request (streaming pays this once per event)."""
        if self._text_frame is None:
            mark = json.dumps(_TEXT_MARK).encode()
            prefix, _, suffix = self.chunk(_TEXT_MARK).partition(mark)
            self._text_frame = (prefix, suffix)
        prefix, suffix = self._text_frame
        return prefix + json.dumps(text).encode() + suffix

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int | None = None) -> bytes:
        body = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return sse(body)


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
