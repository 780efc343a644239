"""Constraint inside the engine's batch: a random-weight model (whose free output is noise)
produces output that parses and validates under a grammar; rows without one produce exactly
what they produce alone; the grammar state follows the request through n > 1, a resumed
(migrated) request, preemption by recompute, and abort."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.core.sampling_params import SamplingParams
from engine.core.structured import StructuredSpec
from engine.frontend.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine

SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["cat", "dog", "bird"]}, "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["kind", "ok", "tags"], "additionalProperties": False}
SPEC = StructuredSpec("json_schema", json.dumps(SCHEMA))
PROMPT = [504, 3458, 30, 1542, 28, 16, 42]


def make(model_dir: Path, **kw: Any) -> LLMEngine:
    return LLMEngine.from_kwargs(model=str(model_dir), dtype="float32",
                                 **{"num_blocks": 64, **kw})


def run(engine: LLMEngine, by_choice: bool = False) -> dict[str, list[int]]:
    """Each request's output tokens (``by_choice``: keyed "id/index")."""
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            key = f"{o.request_id}/{o.index}" if by_choice else o.request_id
            out.setdefault(key, []).extend(o.new_token_ids)
    return out


def text(engine: LLMEngine, ids: list[int]) -> str:
    return str(engine.tokenizer.decode(ids, skip_special_tokens=True))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    return make(tiny_model_dir)


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=60, structured=SPEC),
    SamplingParams(max_tokens=60, temperature=1.0, seed=5, structured=SPEC),
    SamplingParams(max_tokens=60, temperature=0.7, top_k=20, seed=1, logprobs=2,
                   repetition_penalty=1.3, structured=SPEC),
])
def test_a_random_model_answers_valid_json_under_a_schema(engine: LLMEngine,
                                                          params: SamplingParams) -> None:
    engine.add_request(PROMPT, params, request_id="c")
    out = run(engine)["c"]
    jsonschema.validate(json.loads(text(engine, out)), SCHEMA)
    assert len(engine.runner.grammar_rows) == 0  # freed when it finished


@pytest.mark.parametrize("spec,check", [
    # random weights open a key and rarely close it: the prefix is all that is sure here
    (StructuredSpec("json_object"), lambda s: s.startswith('{"') and "\n" not in s),
    (StructuredSpec("regex", r"[0-9]{3}-[a-z]{2}"), lambda s: len(s) == 6 and s[3] == "-"),
    (StructuredSpec("choice", json.dumps(["yes", "no", "maybe so"])),
     lambda s: s in ("yes", "no", "maybe so")),
    (StructuredSpec("grammar", 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[1-9]/'),
     lambda s: s.startswith("(") and s.endswith(")")),
])
def test_each_kind_constrains(engine: LLMEngine, spec: StructuredSpec, check: Any) -> None:
    engine.add_request(PROMPT, SamplingParams(max_tokens=40, structured=spec), request_id="k")
    out = text(engine, run(engine)["k"])
    assert check(out), out


def test_greedy_grammar_rows_answer_the_same_by_the_greedy_head(engine: LLMEngine) -> None:
    """A greedy grammar row takes the greedy head's token when its grammar allows it, else
    the masked logits' argmax: the same tokens as always masking (logprobs force that)."""
    for spec in (SPEC, StructuredSpec("regex", r"[a-z]{3,8}( [a-z]{3,8}){2}")):
        engine.add_request(PROMPT, SamplingParams(max_tokens=40, structured=spec),
                           request_id="head")
        engine.add_request(PROMPT, SamplingParams(max_tokens=40, logprobs=0, structured=spec),
                           request_id="masked")
        out = run(engine)
        assert out["head"] == out["masked"]


def test_free_rows_are_untouched_by_constrained_neighbours(engine: LLMEngine) -> None:
    free = SamplingParams(max_tokens=20, ignore_eos=True)
    engine.add_request(PROMPT, free, request_id="alone")
    alone = run(engine)["alone"]
    engine.add_request(PROMPT, free, request_id="free")
    engine.add_request(PROMPT, SamplingParams(max_tokens=20, structured=SPEC), request_id="c1")
    engine.add_request(PROMPT[:3], SamplingParams(max_tokens=20, structured=SPEC),
                       request_id="c2")
    out = run(engine)
    assert out["free"] == alone
    assert out["c1"] != alone


def test_n_choices_each_follow_the_grammar(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=3, n=3, structured=SPEC)
    engine.add_request(PROMPT, params, request_id="n")
    choices = list(run(engine, by_choice=True).values())
    assert len(choices) == 3
    for ids in choices:
        jsonschema.validate(json.loads(text(engine, ids)), SCHEMA)


def test_a_resumed_request_replays_its_delivered_tokens(engine: LLMEngine) -> None:
    engine.add_request(PROMPT, SamplingParams(max_tokens=60, structured=SPEC),
                       request_id="whole")
    whole = run(engine)["whole"]
    k = len(whole) // 2
    resumed = StructuredSpec(SPEC.kind, SPEC.source, prefix=tuple(whole[:k]))
    engine.add_request(PROMPT + whole[:k], SamplingParams(max_tokens=60 - k, structured=resumed),
                       request_id="rest")
    assert whole[:k] + run(engine)["rest"] == whole


def test_preemption_by_recompute_keeps_the_output_valid(tiny_model_dir: Path) -> None:
    # 6 blocks of 16 tokens for 4 sequences that each grow past one block: preemptions
    engine = make(tiny_model_dir, num_blocks=6, block_size=16, preemption_mode="recompute")
    for i in range(4):
        engine.add_request(PROMPT, SamplingParams(max_tokens=40, temperature=1.0, seed=i,
                                                  structured=SPEC), request_id=f"r{i}")
    out = run(engine)
    assert engine.scheduler.stats.preemptions_recompute > 0
    for ids in out.values():
        jsonschema.validate(json.loads(text(engine, ids)), SCHEMA)
    assert len(engine.runner.grammar_rows) == 0


def test_the_prefix_cache_shares_kv_across_constrained_and_free(tiny_model_dir: Path) -> None:
    engine = make(tiny_model_dir, block_size=16)
    prompt = list(range(100, 164))  # four full blocks
    engine.add_request(prompt, SamplingParams(max_tokens=4), request_id="free")
    run(engine)
    engine.add_request(prompt, SamplingParams(max_tokens=20, structured=SPEC), request_id="c")
    first = engine.step()
    assert first and first[0].num_cached_tokens >= 48
    run(engine)


def test_abort_frees_the_grammar_state(engine: LLMEngine) -> None:
    engine.add_request(PROMPT, SamplingParams(max_tokens=60, structured=SPEC), request_id="a")
    engine.step()
    engine.step()
    assert len(engine.runner.grammar_rows) == 1
    engine.abort("a")
    run(engine)
    assert len(engine.runner.grammar_rows) == 0


def test_a_bad_grammar_is_refused_at_add(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match="uniqueItems"):
        engine.add_request(PROMPT, SamplingParams(structured=StructuredSpec(
            "json_schema", json.dumps({"type": "array", "uniqueItems": True}))))
    assert not engine.has_unfinished_requests()


async def test_the_async_front_posts_a_request_once_compiled(tiny_model_dir: Path) -> None:
    engine = AsyncEngine(engine=make(tiny_model_dir))
    await engine.start()
    try:
        spec = StructuredSpec("json_schema", json.dumps({**SCHEMA, "title": "fresh"}))
        ids: list[int] = []
        async for o in engine.generate("g", PROMPT, SamplingParams(max_tokens=60,
                                                                   structured=spec)):
            ids += o.new_token_ids
        jsonschema.validate(json.loads(text(engine.engine, ids)), SCHEMA)
        bad = StructuredSpec("regex", "[a-")
        outs = [o async for o in engine.generate("b", PROMPT,
                                                 SamplingParams(structured=bad))]
        assert outs[-1].finish_reason == "error" and "unclosed" in (outs[-1].error or "")
    finally:
        await engine.shutdown()
