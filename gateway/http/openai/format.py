"""OpenAI response bodies and stream chunks for chat and text completions."""

from __future__ import annotations

import json
from typing import Any


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# Stands for the text in a chunk built once per request; only the text changes between chunks.
_TEXT_MARK = "\x00carpool-text\x00"


class Formatter:
    """Builds bodies for one request (chat or completion)."""

    def __init__(self, kind: str, request_id: str, model: str, created: int,
                 service_tier: str) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created
        self.tier = service_tier
        self._text_frame: tuple[bytes, bytes] | None = None

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model, "service_tier": self.tier}

    def full(self, text: str, finish_reason: str, prompt_tokens: int,
             completion_tokens: int) -> dict[str, Any]:
        reason = str(finish_reason)  # a FinishReason: OpenAI spells stop and length alike
        if self.kind == "chat":
            body = self._base("chat.completion")
            body["choices"] = [{"index": 0, "finish_reason": reason, "logprobs": None,
                                "message": {"role": "assistant", "content": text}}]
        else:
            body = self._base("text_completion")
            body["choices"] = [{"index": 0, "text": text, "finish_reason": reason,
                                "logprobs": None}]
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body

    def chunk(self, text: str | None, finish_reason: str | None = None,
              first: bool = False) -> bytes:
        reason = str(finish_reason) if finish_reason else None
        if self.kind == "chat":
            body = self._base("chat.completion.chunk")
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            body["choices"] = [{"index": 0, "delta": delta, "finish_reason": reason,
                                "logprobs": None}]
        else:
            body = self._base("text_completion")
            body["choices"] = [{"index": 0, "text": text or "", "finish_reason": reason,
                                "logprobs": None}]
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

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        body = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return sse(body)


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
