"""Parse and validate OpenAI request bodies into one typed ``ParsedRequest``.

Everything here raises ``APIError(400/404)`` with the offending ``param``; nothing raises
anything else on bad input (wrong types, missing fields, out-of-range values).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from engine.core.sampling_params import MAX_LOGPROBS
from engine.core.structured import StructuredSpec
from gateway.http.errors import APIError, bad_request
from gateway.http.openai.structured import parse_structured
from gateway.http.openai.tools import (
    ToolPlan,
    assistant_calls,
    native_tools,
    parse_tools,
    tool_spec,
    with_tools,
)

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_STOP_CHARS = 256
MAX_STOP = 4


@dataclass(frozen=True)
class ParsedRequest:
    kind: str  # "chat" | "completion"
    model: str
    prompt_token_ids: list[int]
    max_tokens: int | None  # None = not given (the gateway picks a default)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    service_tier: str | None = None
    n: int = 1  # choices
    top_k: int = 0
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: list[list[float]] = field(default_factory=list)  # [token_id, bias] pairs
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None  # None: none; k: the sampled token's and k alternatives
    # the output constraint (response_format, guided_*, or the tools' format) and the field
    # it came from (a compile error's ``param``); tools: the tool plan (chat only)
    structured: StructuredSpec | None = None
    structured_param: str | None = None
    tools: ToolPlan | None = None


def _typed(body: dict[str, Any], name: str, types: tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types:
        raise bad_request(f"'{name}' must be of type {types[0].__name__}", param=name)
    if not isinstance(value, types):
        raise bad_request(f"'{name}' must be of type {types[0].__name__}", param=name)
    return value


def _common(body: dict[str, Any], served_model: str, vocab_size: int,
            max_n: int) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", param="model")
    if model != served_model:
        raise APIError(404, f"The model '{model}' does not exist (this server serves "
                            f"'{served_model}')", code="model_not_found", param="model")
    n = _typed(body, "n", (int,), 1)
    if not 1 <= n <= max_n:
        raise bad_request(f"'n' must be between 1 and {max_n} (this server's limit)", param="n")
    if _typed(body, "best_of", (int,), n) != n:
        raise bad_request("best_of is not supported (only best_of == n)", param="best_of")
    max_tokens = _typed(body, "max_completion_tokens", (int,), None)
    if max_tokens is None:
        max_tokens = _typed(body, "max_tokens", (int,), None)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request("'max_tokens' must be >= 1", param="max_tokens")
    temperature = _number(body, "temperature", 1.0)
    if not 0.0 <= temperature <= 2.0:
        raise bad_request("'temperature' must be between 0 and 2", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad_request("'top_p' must be in (0, 1]", param="top_p")
    seed = _typed(body, "seed", (int,), None)
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise bad_request("'seed' must fit in 64 bits", param="seed")
    stream = _typed(body, "stream", (bool,), False)
    options = _typed(body, "stream_options", (dict,), None)
    if options is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true",
                          param="stream_options")
    include_usage = False
    if options is not None:
        include_usage = bool(_typed(options, "include_usage", (bool,), False))
    tier = _typed(body, "service_tier", (str,), None)
    return {"model": model, "n": n, "max_tokens": max_tokens, "temperature": temperature,
            "top_p": top_p, "seed": seed, "stop": _stop(body.get("stop")), "stream": stream,
            "include_usage": include_usage, "service_tier": tier,
            **_sampling_extras(body, max_tokens, vocab_size)}


def _sampling_extras(body: dict[str, Any], max_tokens: int | None,
                     vocab_size: int) -> dict[str, Any]:
    """vLLM's extra sampling fields and OpenAI's penalties and logit_bias, checked with
    vLLM's/OpenAI's ranges."""
    top_k = _typed(body, "top_k", (int,), 0)
    if top_k < -1:
        raise bad_request("'top_k' must be -1 (off), 0 (off) or >= 1", param="top_k")
    min_p = _number(body, "min_p", 0.0)
    if not 0.0 <= min_p <= 1.0:
        raise bad_request("'min_p' must be between 0 and 1", param="min_p")
    min_tokens = _typed(body, "min_tokens", (int,), 0)
    if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
        raise bad_request("'min_tokens' must be >= 0 and at most max_tokens", param="min_tokens")
    repetition = _number(body, "repetition_penalty", 1.0)
    if not repetition > 0.0:
        raise bad_request("'repetition_penalty' must be > 0", param="repetition_penalty")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        penalties[name] = _number(body, name, 0.0)
        if not -2.0 <= penalties[name] <= 2.0:
            raise bad_request(f"'{name}' must be between -2 and 2", param=name)
    # top_k >= the vocabulary keeps every token: off (and a 10**30 would not fit the message)
    return {"top_k": top_k if 0 < top_k < vocab_size else 0, "min_p": min_p,
            "min_tokens": min_tokens, "repetition_penalty": repetition, **penalties,
            "logit_bias": _logit_bias(body.get("logit_bias"), vocab_size),
            "ignore_eos": _typed(body, "ignore_eos", (bool,), False),
            "stop_token_ids": _token_ids(body, "stop_token_ids", vocab_size)}


def _token_ids(body: dict[str, Any], name: str, vocab_size: int) -> list[int]:
    ids = _typed(body, name, (list,), [])
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
               for t in ids):
        raise bad_request(f"'{name}' must be a list of token ids in [0, {vocab_size})",
                          param=name)
    return list(ids)


MAX_LOGIT_BIAS = 300  # entries (OpenAI allows up to 300)
_TOKEN_KEY = re.compile(r"-?[0-9]+")  # ASCII only: str.isdigit() passes "²", which int() refuses


def _logit_bias(value: Any, vocab_size: int) -> list[list[float]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object of token id -> bias", param="logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' allows at most {MAX_LOGIT_BIAS} entries",
                          param="logit_bias")
    pairs = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and _TOKEN_KEY.fullmatch(key.strip()) else None
        if token is None or not 0 <= token < vocab_size:
            raise bad_request(f"'logit_bias' key {key!r} is not a token id in [0, {vocab_size})",
                              param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -100 <= bias <= 100:
            raise bad_request(f"'logit_bias' value for {key} must be a number in [-100, 100]",
                              param="logit_bias")
        pairs.append([token, float(bias)])
    return pairs


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat: ``logprobs`` (bool) and ``top_logprobs`` (0..20, only with logprobs)."""
    wanted = _typed(body, "logprobs", (bool,), False)
    top = _typed(body, "top_logprobs", (int,), None)
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad_request(f"'top_logprobs' must be between 0 and {MAX_LOGPROBS}",
                          param="top_logprobs")
    if top is not None and not wanted:
        raise bad_request("'top_logprobs' needs 'logprobs' set to true", param="top_logprobs")
    return (top or 0) if wanted else None


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions (legacy): ``logprobs`` is the number of alternatives, 0..20."""
    value = _typed(body, "logprobs", (int,), None)
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(f"'logprobs' must be between 0 and {MAX_LOGPROBS}", param="logprobs")
    return value  # type: ignore[no-any-return]


def _number(body: dict[str, Any], key: str, default: float) -> float:
    raw = _typed(body, key, (int, float), default)
    try:
        value = float(raw)
    except OverflowError:  # a 400-digit integer is valid JSON
        value = math.inf
    if not math.isfinite(value):
        raise bad_request(f"'{key}' must be a finite number", param=key)
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"'stop' allows at most {MAX_STOP} sequences", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        # matching holds back up to len(stop) characters per step on the engine thread
        raise bad_request(f"each 'stop' sequence allows at most {MAX_STOP_CHARS} characters",
                          param="stop")
    return list(stops)


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad_request("only text content parts are supported",
                                  param=f"messages[{index}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request("message content must be a string or a list of text parts",
                      param=f"messages[{index}].content")


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text``, no special tokens added. Straight through the fast tokenizer
    when there is one: the transformers wrapper routes one text through ``encode_batch`` and
    costs ~2.5x as much per call (the same ids; tests compare them)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _constraint(body: dict[str, Any], tools: ToolPlan | None,
                max_grammar_bytes: int) -> dict[str, Any]:
    found = parse_structured(body, max_grammar_bytes)
    spec = tool_spec(tools) if tools is not None else None
    if spec is not None:
        if found is not None:
            raise bad_request(f"'{found[1]}' cannot be combined with tools that may be "
                              f"called; use tool_choice 'none'", param=found[1])
        return {"structured": spec, "structured_param": "tools", "tools": tools}
    if found is not None:
        return {"structured": found[0], "structured_param": found[1], "tools": tools}
    return {"tools": tools}


def _chat_message(m: dict[str, Any], i: int, native: bool) -> dict[str, Any]:
    content = _content_text(m.get("content"), i)
    calls = m.get("tool_calls")
    if m["role"] != "assistant" or not calls:
        return {"role": m["role"], "content": content}
    if not native:
        return {"role": "assistant", "content": content + assistant_calls(calls, i)}
    assistant_calls(calls, i)  # the same checks
    return {"role": "assistant", "content": content, "tool_calls": [
        {"type": "function", "function": {"name": c["function"]["name"],
                                          "arguments": _json_or_text(c["function"])}}
        for c in calls]}


def _json_or_text(fn: dict[str, Any]) -> Any:
    try:
        return json.loads(fn.get("arguments") or "{}")
    except ValueError:
        return fn.get("arguments")


def parse_chat(body: dict[str, Any], tokenizer: Any, served_model: str,
               vocab_size: int, max_n: int = 1,
               max_grammar_bytes: int = 32768) -> ParsedRequest:
    common = _common(body, served_model, vocab_size, max_n)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    tools = parse_tools(body)
    native = native_tools(tokenizer)
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad_request(f"messages[{i}] needs a 'role' in {ROLES}", param=f"messages[{i}]")
        clean.append(_chat_message(m, i, native))
    extra: dict[str, Any] = {}
    if native and tools is not None and tools.constrains:
        extra["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in tools.tools]
    elif not native:
        clean = with_tools(clean, tools)
    try:
        text = tokenizer.apply_chat_template(clean, tokenize=False, add_generation_prompt=True,
                                             **extra)
    except Exception as exc:  # template errors are the caller's input (e.g. role order)
        raise bad_request(f"messages do not fit the model's chat template: {exc}",
                          param="messages") from exc
    ids = encode_text(tokenizer, text)
    return ParsedRequest(kind="chat", prompt_token_ids=ids, logprobs=_chat_logprobs(body),
                         **common, **_constraint(body, tools, max_grammar_bytes))


def parse_completion(body: dict[str, Any], tokenizer: Any, served_model: str,
                     vocab_size: int, max_n: int = 1,
                     max_grammar_bytes: int = 32768) -> ParsedRequest:
    common = _common(body, served_model, vocab_size, max_n)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = encode_text(tokenizer, prompt)
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(not 0 <= t < vocab_size for t in prompt):
            raise bad_request(f"token ids must be in [0, {vocab_size})", param="prompt")
        ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("batched prompts are not supported: send one prompt per request",
                          param="prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", param="prompt")
    if not ids:
        raise bad_request("'prompt' must not be empty", param="prompt")
    return ParsedRequest(kind="completion", prompt_token_ids=ids,
                         logprobs=_completion_logprobs(body), **common,
                         **_constraint(body, None, max_grammar_bytes))
