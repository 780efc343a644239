"""The response side of tool calls: the text the engine produced in the constrained format
(``tools.py``) turned back into OpenAI's ``tool_calls``, whole or streamed.

A streamed call goes out the way the ``openai`` SDK's stream helpers reassemble it: one
``delta.tool_calls`` entry with ``index``, ``id``, ``type`` and ``function.name`` (arguments
empty) as soon as the name is known, then entries with the same ``index`` and the next
piece of ``function.arguments``. The closing ``}</tool_call>`` is held back until the choice
ends, so no piece ever carries it. A choice that called a tool and ended naturally finishes
with ``tool_calls``; one cut by ``max_tokens`` keeps ``length`` (its arguments are cut too).
Under ``auto`` an answer that does not begin with ``<`` is plain content, streamed at once.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from gateway.http.openai.tools import CLOSE, OPEN

_HEADER = re.compile(re.escape(OPEN) + r'\{"name":"((?:[^"\\]|\\.)*)","arguments":')
_TAIL = "}" + CLOSE


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_calls(text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(content, tool_calls) of a whole answer: a complete call becomes one tool call and no
    content; anything else stays content."""
    m = _HEADER.match(text)
    if m is None or not text.endswith(_TAIL):
        return text, None
    return None, [{"id": call_id(), "type": "function",
                   "function": {"name": m.group(1), "arguments": text[m.end():-len(_TAIL)]}}]


def finish_reason(reason: str, called: bool) -> str:
    return "tool_calls" if called and reason == "stop" else reason


class CallStream:
    """One choice's text, fed as it comes, as the deltas to send (``{"content": ...}`` or
    ``{"tool_calls": [...]}``)."""

    def __init__(self, auto: bool) -> None:
        self.mode = "undecided" if auto else "call"
        self.buf = ""
        self.id = call_id()
        self.args_at: int | None = None  # where the arguments start in ``buf``
        self.sent = 0  # argument characters sent
        self.called = False  # the call was complete

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self.mode == "text":
            return [{"content": text}] if text else []
        self.buf += text
        if self.mode == "undecided":
            if not self.buf:
                return []
            if not self.buf.startswith("<"):
                self.mode = "text"
                return [{"content": self.buf}]
            self.mode = "call"
        return self._call(final=False)

    def end(self) -> list[dict[str, Any]]:
        """What is still held back, once the choice ended."""
        if self.mode != "call":
            return []
        out = self._call(final=True)
        if self.args_at is None and self.buf:  # cut before the name: the text as content
            return [{"content": self.buf}]
        return out

    def _call(self, final: bool) -> list[dict[str, Any]]:
        out = []
        if self.args_at is None:
            m = _HEADER.match(self.buf)
            if m is None:
                return []
            self.args_at = m.end()
            out.append({"tool_calls": [{"index": 0, "id": self.id, "type": "function",
                                        "function": {"name": m.group(1), "arguments": ""}}]})
        args = self.buf[self.args_at:]
        if final:
            self.called = args.endswith(_TAIL)
            end = len(args) - len(_TAIL) if self.called else len(args)
        else:
            end = len(args) - len(_TAIL)
        if end > self.sent:
            out.append({"tool_calls": [{"index": 0,
                                        "function": {"arguments": args[self.sent:end]}}]})
            self.sent = end
        return out
