"""The validity measure on 200 generated schema cases: every constrained answer that ended on
its own parses and validates (``jsonschema``), whatever the model; the tiny random model's
free answers never do. (SmolLM2's numbers: docs/structured-outputs.md.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.bench.structured_validity import make_cases, measure
from engine.llm_engine import LLMEngine

pytestmark = pytest.mark.timeout(600)


def test_every_finished_constrained_answer_validates(tiny_model_dir: Path) -> None:
    engine = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32",
                                   max_num_seqs=64, num_blocks=2048, max_model_len=1024)
    cases = make_cases(200)
    constrained, free, _ = measure(engine, cases, max_tokens=48)
    assert constrained.invalid == 0, constrained.failures[:3]
    assert constrained.valid + constrained.truncated == 200
    assert constrained.valid >= 20  # enums, booleans and bounded strings close in time
    assert free.valid == 0
    kinds = {json.dumps(c[0]) for c in cases}
    assert len(kinds) == 200  # 200 different schemas
    nested = [k for k in kinds if k.count('"type": "object"') > 1]
    assert nested, "no nested object among the cases"
    text = " ".join(kinds)
    for feature in ("anyOf", "enum", "minItems", "maxItems", "maxLength", "required"):
        assert feature in text
