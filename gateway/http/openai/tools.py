"""Tool calls on chat completions: ``tools`` and ``tool_choice`` read into a ``ToolPlan``, the
tools and the history's calls rendered into the prompt, and the grammar the engine
constrains the answer to.

The format (the engine constrains to it; the response side parses it back, ``tool_calls.py``)::

    <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>

one call per answer, compact JSON, ``name`` first, the arguments matching the function's
``parameters`` schema. By ``tool_choice``:

- ``none``: no tool list in the prompt, no constraint (the history is still rendered);
- ``auto`` (the default when ``tools`` is given): the answer is either text that does not
  begin with ``<``, or one call;
- ``required``: one call to any of the tools; ``{"type": "function", "function":
  {"name": ...}}``: one call to that tool.

Rendering, for a chat template without tool syntax (SmolLM2's has none): the tool list and
the format above go at the end of the system message (one is added when there is none);
an assistant message's ``tool_calls`` become its content, each call in the format above;
a ``tool`` message keeps the ``tool`` role with its content. A template that declares tools
(its source mentions ``tools``) gets them as ``tools=`` and the messages as they came.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.core.structured import StructuredSpec
from gateway.http.errors import bad_request

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 128


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None = None

    @property
    def constrains(self) -> bool:
        return self.choice != "none"


def parse_tools(body: dict[str, Any]) -> ToolPlan | None:
    """The request's tools and tool_choice; None when it has no tools (a ``tool_choice``
    other than ``none`` without tools is a 400)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} tools", param="tools")
    tools, seen = [], set()
    for i, t in enumerate(raw):
        tool = _tool(t, i)
        if tool.name in seen:
            raise bad_request(f"duplicate tool name {tool.name!r}", param=f"tools[{i}].function.name")
        seen.add(tool.name)
        tools.append(tool)
    return ToolPlan(tuple(tools), *_choice(choice, seen))


def _tool(t: Any, i: int) -> Tool:
    fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
    if not isinstance(fn, dict):
        raise bad_request("each tool must be {'type': 'function', 'function': {...}}",
                          param=f"tools[{i}]")
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not all(
            c.isascii() and (c.isalnum() or c in "_-") for c in name):
        raise bad_request("a function name must be 1-64 letters, digits, '_' or '-'",
                          param=f"tools[{i}].function.name")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise bad_request("'parameters' must be a JSON Schema object",
                          param=f"tools[{i}].function.parameters")
    desc = fn.get("description") or ""
    if not isinstance(desc, str):
        raise bad_request("'description' must be a string", param=f"tools[{i}].function.description")
    return Tool(name, desc, params)


def _choice(choice: Any, names: set[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function"
            and isinstance(name, str)):
        raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
    if name not in names:
        raise bad_request(f"'tool_choice' names {name!r}, which is not in 'tools'",
                          param="tool_choice")
    return "named", name


# -- the constraint -------------------------------------------------------------------------

def call_schema(tools: tuple[Tool, ...]) -> dict[str, Any]:
    options = [{"type": "object", "properties": {"name": {"const": t.name},
                                                 "arguments": t.parameters},
                "required": ["name", "arguments"], "additionalProperties": False}
               for t in tools]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


def tool_spec(plan: ToolPlan) -> StructuredSpec | None:
    """The Lark grammar of the answer's format (module doc); None for ``none``."""
    if not plan.constrains:
        return None
    tools = plan.tools if plan.named is None else tuple(
        t for t in plan.tools if t.name == plan.named)
    call = f'"{OPEN}" %json {json.dumps(call_schema(tools), separators=(",", ":"))} "{CLOSE}"'
    if plan.choice == "auto":
        grammar = f"start: TEXT | call\ncall: {call}\nTEXT: /[^<][\\s\\S]*/\n"
    else:
        grammar = f"start: {call}\n"
    return StructuredSpec("grammar", grammar)


# -- rendering ------------------------------------------------------------------------------

def native_tools(tokenizer: Any) -> bool:
    """Whether the chat template has tool syntax of its own."""
    return "tools" in str(getattr(tokenizer, "chat_template", None) or "")


def render_call(name: str, arguments: str) -> str:
    """One call as the model writes it (``arguments`` is a JSON string)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = arguments
    body = json.dumps({"name": name, "arguments": args}, separators=(",", ":"),
                      ensure_ascii=False)
    return f"{OPEN}{body}{CLOSE}"


def tool_instructions(plan: ToolPlan) -> str:
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description,
                                   "parameters": t.parameters}, ensure_ascii=False)
                       for t in plan.tools)
    return (f"You can call these functions:\n<tools>\n{listed}\n</tools>\n"
            f'To call a function, answer with {OPEN}{{"name": <function name>, "arguments": '
            f"<arguments as a JSON object>}}{CLOSE} and nothing else.")


def with_tools(messages: list[dict[str, Any]], plan: ToolPlan | None) -> list[dict[str, Any]]:
    """``messages`` (role and text content) with the tool list in the system message."""
    if plan is None or not plan.constrains:
        return messages
    text = tool_instructions(plan)
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}".strip()}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def assistant_calls(calls: Any, index: int) -> str:
    """An assistant message's ``tool_calls`` as the text the model would have written."""
    if not isinstance(calls, list):
        raise bad_request("'tool_calls' must be a list", param=f"messages[{index}].tool_calls")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                and isinstance(fn.get("arguments", "{}"), str)):
            raise bad_request("each tool call needs function.name and function.arguments "
                              "(a JSON string)", param=f"messages[{index}].tool_calls[{k}]")
        out.append(render_call(fn["name"], fn.get("arguments", "{}")))
    return "".join(out)
