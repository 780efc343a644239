"""The grammar backend: llguidance (``docs/structured-outputs.md`` says why, with the
measurements of ``engine/bench/grammar_backends.py``). Torch-free.

A ``StructuredSpec`` becomes llguidance's grammar text (``grammar_text``), which
``check`` validates against the model's tokenizer: an error names what is wrong (a JSON
Schema keyword llguidance does not implement, a bad regex, a Lark syntax error) and is the
gateway's 400. ``new_matcher`` builds the parser a row steps through; llguidance builds its
lexer lazily, so this is the compile the cache keeps (``engine.structured.compiler``).

JSON comes out compact (no whitespace between tokens, ``,`` and ``:`` separators): a small
model given the freedom to emit whitespace can emit it until ``max_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

from engine.core.structured import StructuredSpec

# ``whitespace_flexible``: false, see the module doc. ``lenient`` stays false: a keyword the
# backend does not implement is an error that names it, not a constraint silently dropped.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
ANY_OBJECT = '{"type": "object"}'
# Bounds on what one grammar may cost (llguidance's ``LLParserLimits``): grammar size, and
# the lexer's work per mask (the per-step cost of the row). Below llguidance's defaults,
# which are sized for bigger machines; plenty for the schemas clients send.
LIMITS = {"max_grammar_size": 200_000, "step_lexer_fuel": 200_000, "step_max_items": 50_000,
          "max_lexer_states": 100_000}
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def _ll() -> Any:
    import llguidance  # imported on first use: engines and gateways without constraints skip it

    return llguidance


def make_tokenizer(hf_tokenizer: Any, eos_token_ids: list[int] | None = None) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer (about a second for 49k tokens:
    build once per process). ``eos_token_ids``: the ids that end a sequence."""
    ll = _ll()
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("structured outputs need a fast (tokenizers) tokenizer")
    eos = eos_token_ids or [hf_tokenizer.eos_token_id]
    return ll.LLTokenizer(backend.to_str(), n_vocab=None, eos_token=list(eos))


def grammar_text(spec: StructuredSpec) -> str:
    """llguidance's grammar for ``spec``. ValueError for a source that is not even the
    right shape (a schema that is not JSON, a choice list that is not a list of strings)."""
    m = _ll().LLMatcher
    if spec.kind == "json_schema":
        return str(m.grammar_from_json_schema(spec.source, defaults=JSON_OPTIONS))
    if spec.kind == "json_object":
        return str(m.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_OPTIONS))
    if spec.kind == "regex":
        return str(m.grammar_from_regex(spec.source))
    if spec.kind == "choice":
        return str(m.grammar_from_regex(choice_regex(json.loads(spec.source))))
    return str(m.grammar_from_lark(spec.source))


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices`` (each escaped)."""
    if not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError("a choice list must be a non-empty list of strings")
    return "|".join("(" + "".join("\\" + ch if ch in _REGEX_META else ch for ch in c) + ")"
                    for c in choices)


def limits() -> Any:
    return _ll().LLParserLimits(**LIMITS, verbose_errors=False)


def check(grammar: str, tokenizer: Any) -> str | None:
    """None when ``grammar`` is valid for ``tokenizer``, else llguidance's error message."""
    ll = _ll()
    is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=limits())
    return "; ".join(messages) if is_error else None


def new_matcher(grammar: str, tokenizer: Any) -> Any:
    """A fresh parser for ``grammar`` (ValueError with the backend's message when it is
    invalid)."""
    matcher = _ll().LLMatcher(tokenizer, grammar, log_level=0, limits=limits())
    if matcher.is_error():
        raise ValueError(matcher.get_error())
    return matcher
