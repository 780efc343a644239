"""OpenAI response bodies and stream chunks for chat and text completions.

A request of ``n`` choices streams each choice's chunks with its ``index`` (and its own
finish chunk when it ends); its full body lists the n choices in index order.

With logprobs asked for (the ``Formatter`` got a ``TokenText``), every body and chunk that
carries text carries the logprobs of the tokens it covers (``openai/logprobs.py`` shapes
them); ``usage.prompt_tokens_details.cached_tokens`` reports prefix-cache hits when the
worker told them.

A chat request with tools (the ``Formatter`` got ``tools``: "auto" or "call") answers a call
as ``message.tool_calls`` / streamed ``delta.tool_calls`` (``openai/tool_calls.py``); in a
stream, a token message's logprobs ride on the next chunk that choice sends.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.bus.messages import TokenMsg
from gateway.http.openai.logprobs import TokenText, chat_logprobs, completion_logprobs
from gateway.http.openai.tool_calls import CallStream, finish_reason, parse_calls


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
    """Builds bodies for one request (chat or completion) of ``n`` choices."""

    def __init__(self, kind: str, request_id: str, model: str, created: int,
                 service_tier: str, texts: TokenText | None = None, n: int = 1,
                 tools: str | None = None) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created
        self.tier = service_tier
        self.texts = texts  # set: the request asked for logprobs
        self.n = n
        self._text_frame: tuple[bytes, bytes] | None = None
        self._offsets = [0] * n  # completions' text_offset: characters streamed per choice
        self._ended: set[int] = set()  # choices whose finish chunk went out (n > 1)
        # tools: each choice's call parser, and the logprobs not yet sent with a chunk
        self.tools = tools
        self._calls = [CallStream(tools == "auto") for _ in range(n)] if tools else []
        self._held: list[tuple[list[int], list[Any]]] = [([], []) for _ in range(n)]

    def _logprobs(self, ids: list[int], lps: list[Any], index: int = 0) -> dict[str, Any] | None:
        if self.texts is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(self.texts, ids, lps)
        body = completion_logprobs(self.texts, ids, lps, self._offsets[index])
        self._offsets[index] += sum(len(t) for t in body["tokens"])
        return body

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model, "service_tier": self.tier}

    def full(self, msgs: list[TokenMsg], finish_reason: str, prompt_tokens: int,
             completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
        """The whole answer from every token message; each choice's finish reason is its own
        (n > 1) or the request's."""
        reason = str(finish_reason)  # a FinishReason: OpenAI spells stop and length alike
        body = self._base("chat.completion" if self.kind == "chat" else "text_completion")
        body["choices"] = [self._choice(i, [m for m in msgs if m.index == i], reason)
                           for i in range(self.n)]
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body

    def _choice(self, index: int, msgs: list[TokenMsg], reason: str) -> dict[str, Any]:
        text = "".join(m.text for m in msgs)
        ends = [m.finish_reason for m in msgs if m.finish_reason]
        # as in ``tokens``: only the ids of the messages that carry logprobs (an engine that
        # makes none sends none: an empty list, not a misaligned zip)
        lps = self._logprobs([t for m in msgs if m.logprobs for t in m.token_ids],
                             [x for m in msgs for x in m.logprobs or ()], index)
        if self.kind == "chat":
            ended = ends[-1] if ends else reason
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.tools:
                message["content"], calls = parse_calls(text)
                if calls:
                    message["tool_calls"] = calls
                ended = finish_reason(ended, bool(calls))
            return {"index": index, "finish_reason": ended, "logprobs": lps,
                    "message": message}
        return {"index": index, "text": text, "finish_reason": ends[-1] if ends else reason,
                "logprobs": lps}

    def first_chunks(self) -> bytes:
        """What a stream opens with: chat's role delta, one per choice."""
        if self.kind != "chat":
            return b""
        return b"".join(self.chunk("", first=True, index=i) for i in range(self.n))

    def tokens(self, msgs: list[TokenMsg]) -> bytes:
        """The chunks for the token messages of one relay batch (b"" when there is nothing
        to say). One choice: one chunk with all their text. n > 1: a chunk per message, each
        with its choice's index, and a finish chunk when that choice ended."""
        if self.tools:
            return b"".join(self._tool_chunks(m) for m in msgs)
        if self.n == 1:
            text = "".join(m.text for m in msgs)
            ids = [t for m in msgs if m.logprobs for t in m.token_ids]
            lps = [x for m in msgs for x in m.logprobs or ()]
            return self.delta(text, ids, lps) if text or lps else b""
        out = []
        for m in msgs:
            if m.text or m.logprobs:
                out.append(self.chunk(m.text, index=m.index,
                                      logprobs=self._logprobs(m.token_ids, m.logprobs or [],
                                                              m.index)))
            if m.finish_reason:
                out.append(self.chunk(None, m.finish_reason, index=m.index))
                self._ended.add(m.index)
        return b"".join(out)

    def finish_chunks(self, finish_reason: str) -> bytes:
        """The request ended: a finish chunk for each choice that has not had one."""
        if self.tools:
            return b"".join(self._tool_end(i, finish_reason) for i in range(self.n)
                            if i not in self._ended)
        return b"".join(self.chunk(None, finish_reason, index=i) for i in range(self.n)
                        if i not in self._ended)

    def _tool_chunks(self, m: TokenMsg) -> bytes:
        held = self._held[m.index]
        if m.logprobs:
            held[0].extend(m.token_ids)
            held[1].extend(m.logprobs)
        out = [self._delta_chunk(d, m.index) for d in self._calls[m.index].feed(m.text)]
        if m.finish_reason:
            out.append(self._tool_end(m.index, m.finish_reason))
        return b"".join(out)

    def _tool_end(self, index: int, reason: str) -> bytes:
        stream = self._calls[index]
        out = [self._delta_chunk(d, index) for d in stream.end()]
        out.append(self._delta_chunk({}, index, finish_reason(str(reason), stream.called)))
        self._ended.add(index)
        return b"".join(out)

    def _delta_chunk(self, delta: dict[str, Any], index: int,
                     reason: str | None = None) -> bytes:
        ids, lps = self._held[index]
        logprobs = self._logprobs(ids, lps, index) if lps else None
        self._held[index] = ([], [])
        body = self._base("chat.completion.chunk")
        body["choices"] = [{"index": index, "delta": delta, "finish_reason": reason,
                            "logprobs": logprobs}]
        return sse(body)

    def delta(self, text: str, token_ids: list[int], logprobs: list[Any]) -> bytes:
        """A chunk with ``text`` and, when asked for, the logprobs of ``token_ids``."""
        if self.texts is None:
            return self.text_chunk(text)
        return self.chunk(text, logprobs=self._logprobs(token_ids, logprobs))

    def chunk(self, text: str | None, finish_reason: str | None = None,
              first: bool = False, logprobs: dict[str, Any] | None = None,
              index: int = 0) -> bytes:
        reason = str(finish_reason) if finish_reason else None
        if self.kind == "chat":
            body = self._base("chat.completion.chunk")
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            body["choices"] = [{"index": index, "delta": delta, "finish_reason": reason,
                                "logprobs": logprobs}]
        else:
            body = self._base("text_completion")
            body["choices"] = [{"index": index, "text": text or "", "finish_reason": reason,
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
