"""The compiled-grammar cache: keyed by the spec's hash, bounded, compiles off the caller's
thread, and refuses what the backend cannot do with its reason."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from engine.core.structured import StructuredSpec
from engine.model_files import load_tokenizer
from engine.structured.compiler import GrammarCompiler, GrammarError


@pytest.fixture(scope="module")
def compiler(smollm2_dir: Path) -> GrammarCompiler:
    tok = load_tokenizer(smollm2_dir)
    return GrammarCompiler(tok, [tok.eos_token_id])


def schema(n: int) -> StructuredSpec:
    return StructuredSpec("json_schema", json.dumps(
        {"type": "object", "properties": {f"k{n}": {"type": "integer"}}}))


def test_a_spec_compiles_once_and_each_matcher_is_its_own(compiler: GrammarCompiler) -> None:
    before = compiler.compiles
    a, b = compiler.matcher(schema(1)), compiler.matcher(schema(1))
    assert compiler.compiles == before + 1
    assert a.consume_tokens(compiler.tokenizer.tokenize_str('{"k1"'))
    assert not b.is_accepting() and b.validate_tokens(compiler.tokenizer.tokenize_str("{}")) == 1


def test_the_prefix_is_not_part_of_the_key() -> None:
    assert StructuredSpec("regex", "a+", (1, 2)).key == StructuredSpec("regex", "a+").key
    assert StructuredSpec("regex", "a+").key != StructuredSpec("grammar", "a+").key


def test_the_cache_is_bounded_least_recently_used_out(smollm2_dir: Path) -> None:
    tok = load_tokenizer(smollm2_dir)
    small = GrammarCompiler(tok, [tok.eos_token_id], capacity=2)
    for n in (1, 2):
        small.compile(schema(n))
    small.compile(schema(1))  # 1 is now the most recent
    small.compile(schema(3))  # 2 goes
    assert len(small) == 2 and small.compiles == 3
    small.compile(schema(1))
    assert small.compiles == 3
    small.compile(schema(2))
    assert small.compiles == 4


def test_submit_compiles_on_another_thread_and_shares_a_pending_compile(
        compiler: GrammarCompiler) -> None:
    spec = schema(99)
    caller = threading.get_ident()
    seen: list[int] = []
    real = compiler._build

    def build(s: StructuredSpec) -> object:
        seen.append(threading.get_ident())
        return real(s)

    compiler._build = build  # type: ignore[method-assign]
    try:
        first, second = compiler.submit(spec), compiler.submit(spec)
        first.result(timeout=30)
        second.result(timeout=30)
    finally:
        del compiler._build
    assert seen and caller not in seen and len(seen) == 1
    assert compiler.submit(spec).done()  # a hit: done at once


@pytest.mark.parametrize("kind,source,words", [
    ("json_schema", json.dumps({"type": "object", "if": {}, "then": {}}), "if"),
    ("json_schema", json.dumps({"type": "array", "uniqueItems": True}), "uniqueItems"),
    ("json_schema", json.dumps({"type": "strin"}), "strin"),
    ("json_schema", "{not json", "line 1"),
    ("regex", "[a-", "unclosed"),
    ("grammar", "start: foo", "foo"),
    ("choice", json.dumps([1, 2]), "strings"),
])
def test_what_the_backend_refuses_is_an_error_naming_why(
        compiler: GrammarCompiler, kind: str, source: str, words: str) -> None:
    with pytest.raises(GrammarError, match=words):
        compiler.compile(StructuredSpec(kind, source))
    future = compiler.submit(StructuredSpec(kind, source))  # cached, error and all
    assert future.done() and isinstance(future.exception(), GrammarError)
