"""Which top-level request fields Carpool honours, accepts, or refuses.

- Honoured fields (``schema.py`` reads them) and metadata that changes no output (``user``,
  ``metadata``...) are accepted.
- Structured outputs and tools (``response_format``, vLLM's ``guided_*`` and
  ``structured_outputs``, ``tools``/``tool_choice``) are honoured: ``structured.py`` and
  ``tools.py`` read them.
- Fields Carpool knows but cannot honour here (legacy ``functions``, beam search, echo,
  ...) are a 400 naming the field whenever their value asks for something (a harmless value,
  such as ``tools: []`` or ``echo: false``, passes): a client never gets an answer that
  silently ignored what it asked for.
- Anything else is unknown: ignored, as OpenAI does, unless the server runs with
  ``--strict-api`` (``GatewayConfig.strict_api``), which refuses it with a 400 naming it.
- The FAKE echo engine (``--engine echo``) echoes the prompt: ``n > 1`` and ``logprobs`` are
  a 400 there (``check_engine``), not an answer with empty choices or no logprobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.http.errors import bad_request
from gateway.http.openai.schema import ParsedRequest

_COMMON = frozenset({
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
    "service_tier", "n", "logit_bias", "logprobs", "presence_penalty", "frequency_penalty",
    # vLLM's extra sampling fields (sent through the openai client's extra_body)
    "top_k", "min_p", "min_tokens", "repetition_penalty", "ignore_eos", "stop_token_ids",
    # metadata: changes nothing in the answer
    "user", "metadata", "safety_identifier", "prompt_cache_key", "request_id", "store",
    "parallel_tool_calls",
})
# structured outputs (``structured.py``)
_STRUCTURED = frozenset({
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "structured_outputs",
})
HONOURED = {
    "chat": _COMMON | _STRUCTURED | {"messages", "max_completion_tokens", "top_logprobs",
                                     "tools", "tool_choice"},
    "completion": _COMMON | _STRUCTURED | {"prompt", "best_of"},  # best_of: only == n
}


def _off(*harmless: Any) -> Callable[[Any], bool]:
    """A check that a value asks for nothing: None or one of ``harmless``."""
    return lambda v: v is None or any(v == h and type(v) is type(h) for h in harmless)


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {} or v == ""


# vLLM's fields Carpool cannot honour
_VLLM_UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "use_beam_search": _off(False), "length_penalty": _off(1, 1.0),
    "include_stop_str_in_output": _off(False), "skip_special_tokens": _off(True),
    "spaces_between_special_tokens": _off(True), "truncate_prompt_tokens": _empty,
    "prompt_logprobs": _empty, "allowed_token_ids": _empty, "bad_words": _empty,
    "return_tokens_as_token_ids": _off(False), "priority": _off(0),
    "add_special_tokens": _off(False), "logits_processors": _empty,
}

# field -> whether its value asks for nothing (then it passes)
UNSUPPORTED: dict[str, dict[str, Callable[[Any], bool]]] = {
    "chat": {
        "functions": _empty, "function_call": _off("none", "auto"),
        "audio": _empty, "modalities": _off(["text"]), "prediction": _empty,
        "reasoning_effort": _empty, "verbosity": _empty, "web_search_options": _empty,
        "echo": _off(False), "continue_final_message": _off(False),
        "add_generation_prompt": _off(True), "chat_template": _empty,
        "chat_template_kwargs": _empty, "documents": _empty, **_VLLM_UNSUPPORTED,
    },
    "completion": {
        "echo": _off(False), "suffix": _empty, **_VLLM_UNSUPPORTED,
    },
}


def check_fields(body: dict[str, Any], kind: str, strict: bool) -> None:
    """400 naming the first field that asks for what cannot be honoured, or (``strict``)
    the first unknown one."""
    honoured, unsupported = HONOURED[kind], UNSUPPORTED[kind]
    for name, value in body.items():
        if name in honoured:
            continue
        harmless = unsupported.get(name)
        if harmless is not None:
            if not harmless(value):
                raise bad_request(f"'{name}' is not supported by this server "
                                  f"(value {_short(value)})", param=name,
                                  code="unsupported_parameter")
        elif strict:
            raise bad_request(f"Unrecognized request argument supplied: {name}", param=name,
                              code="unknown_parameter")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_engine(parsed: ParsedRequest, engine: str) -> None:
    """400 naming what the configured engine cannot produce (the echo engine: one echoed
    choice, no logprobs, no constraint)."""
    if engine != "echo":
        return
    for name, asked in (("n", parsed.n > 1), ("logprobs", parsed.logprobs is not None),
                        (parsed.structured_param or "", parsed.structured is not None)):
        if asked:
            raise bad_request(f"'{name}' is not supported by the echo engine (a stand-in "
                              f"that echoes the prompt)", param=name,
                              code="unsupported_parameter")
