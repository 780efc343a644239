"""xgrammar against llguidance on the served model's vocabulary: what picking the structured
outputs backend rested on (``docs/structured-outputs.md`` has the table).

    python -m engine.bench.grammar_backends [--model DIR]

For each backend and each schema of ``SCHEMAS``: the one-time tokenizer set-up, the grammar
compile (a cold cache), the mean and worst per-token mask time while a valid instance of the
schema is fed token by token (the first request of that grammar, then a second one from the
cached grammar, as a server sees it), and the resident memory the backend added (RSS, since
both keep their tables outside Python's allocator). Either backend may be missing: it is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
             {"name": "Ada Lovelace", "age": 36}),
    "nested": ({"type": "object", "properties": {
        "id": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
        "status": {"enum": ["open", "closed", "pending"]},
        "owner": {"type": "object", "properties": {
            "email": {"type": "string"}, "score": {"type": "number"},
            "alias": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
            "required": ["email", "score"]}},
        "required": ["id", "tags", "status", "owner"]},
        {"id": 7, "tags": ["a", "bb"], "status": "open",
         "owner": {"email": "x@y.z", "score": 0.5, "alias": None}}),
    "json_object": ({"type": "object"}, {"answer": "yes", "n": [1, 2, 3]}),
}


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t) * 1000


def bench_llguidance(tokenizer: Any, instance_ids: dict[str, list[int]]) -> dict[str, Any]:
    import llguidance
    import llguidance.hf
    from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

    rss0 = rss_mib()
    tok, setup_ms = timed(lambda: llguidance.hf.from_tokenizer(tokenizer))
    rows = {}
    for name, (schema, _) in SCHEMAS.items():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
        pristine, compile_ms = timed(partial(llguidance.LLMatcher, tok, grammar))
        assert not pristine.is_error(), pristine.get_error()
        mask = allocate_token_bitmask(1, tok.vocab_size)
        runs = []
        for _ in range(2):
            matcher, times = pristine.deep_copy(), []
            for t in instance_ids[name]:
                _, ms = timed(partial(fill_next_token_bitmask, matcher, mask, 0))
                times.append(ms)
                assert matcher.consume_token(t), matcher.get_error()
            runs.append(times)
        rows[name] = (compile_ms, runs)
    return {"setup_ms": setup_ms, "rows": rows, "rss_mib": rss_mib() - rss0}


def bench_xgrammar(tokenizer: Any, instance_ids: dict[str, list[int]]) -> dict[str, Any]:
    import xgrammar as xgr

    rss0 = rss_mib()
    info, setup_ms = timed(lambda: xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=len(tokenizer)))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    rows = {}
    for name, (schema, _) in SCHEMAS.items():
        compiled, compile_ms = timed(partial(compiler.compile_json_schema, json.dumps(schema),
                                             any_whitespace=False, separators=(",", ":")))
        mask = xgr.allocate_token_bitmask(1, info.vocab_size)
        runs = []
        for _ in range(2):
            matcher, times = xgr.GrammarMatcher(compiled), []
            for t in instance_ids[name]:
                _, ms = timed(partial(matcher.fill_next_token_bitmask, mask))
                times.append(ms)
                assert matcher.accept_token(t), (name, t)
            runs.append(times)
        rows[name] = (compile_ms, runs)
    return {"setup_ms": setup_ms, "rows": rows, "rss_mib": rss_mib() - rss0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: the bundled one)")
    parser.add_argument("--backend", choices=["llguidance", "xgrammar"], action="append")
    args = parser.parse_args(argv)
    from engine.model_files import load_tokenizer, resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(args.model, None))
    ids = {name: tokenizer.encode(json.dumps(inst, separators=(",", ":")),
                                  add_special_tokens=False) + [tokenizer.eos_token_id]
           for name, (_, inst) in SCHEMAS.items()}
    print(f"vocabulary {len(tokenizer)} tokens")
    runs = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar}
    for backend in args.backend or list(runs):
        try:
            res = runs[backend](tokenizer, ids)
        except ImportError as exc:
            print(f"{backend}: not installed ({exc})")
            continue
        print(f"{backend}: tokenizer set-up {res['setup_ms']:.0f} ms, "
              f"+{res['rss_mib']:.0f} MiB RSS")
        for name, (compile_ms, passes) in res["rows"].items():
            first, again = passes
            print(f"  {name:12s} compile {compile_ms:7.2f} ms  mask (first request) mean "
                  f"{statistics.mean(first) * 1000:5.0f} us max {max(first) * 1000:5.0f} us;"
                  f" (again) mean {statistics.mean(again) * 1000:5.0f} us max "
                  f"{max(again) * 1000:5.0f} us ({len(first)} tokens)")


if __name__ == "__main__":
    main()
