"""Validity of structured outputs on the served model: generated JSON Schema cases answered
with the constraint and without it, every answer checked with ``jsonschema``.

    python -m engine.bench.structured_validity [--cases 200] [--max-tokens 160] [--model DIR]

Each case is a random schema (nested objects, enums, arrays with bounds, ``anyOf``, required
and optional fields, strings with and without a length bound) and one of several prompts
that show the schema; the same prompt runs constrained (``json_schema``) and free, greedy,
in one batch. An answer cut by ``max_tokens`` is counted apart. A free answer is counted
valid strictly (the whole answer is the JSON) and leniently (the first ``{...}`` in it, e.g.
inside a Markdown fence). Needs the dev lock's ``jsonschema``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

WORDS = ["name", "city", "score", "tags", "owner", "status", "id", "items", "price", "note",
         "color", "size", "count", "active", "email", "level", "kind", "title"]
PROMPTS = [
    "Reply with a JSON object that matches this JSON Schema, and nothing else.\n{schema}",
    ("Invent a plausible record about {topic}. Answer only with JSON following this "
     "schema:\n{schema}"),
    "Schema:\n{schema}\nWrite one example instance of it about {topic}.",
    "You are an API. Return JSON for {topic} using this schema: {schema}",
]
TOPICS = ["a bookshop", "a cat", "a football match", "a weather report", "a laptop", "a city",
          "a recipe", "a hotel booking"]


def leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["string", "bounded", "integer", "number", "boolean", "enum"])
    if kind == "bounded":
        return {"type": "string", "maxLength": rng.choice([8, 16, 32])}
    if kind == "integer":
        return {"type": "integer", "minimum": 0, "maximum": rng.choice([10, 100, 10_000])}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "small", "large", "yes", "no"],
                                   rng.randint(2, 4))}
    return {"type": kind}


def value(rng: random.Random, depth: int) -> dict[str, Any]:
    roll = rng.random()
    if depth < 2 and roll < 0.2:
        return obj(rng, depth + 1)
    if roll < 0.35:
        lo = rng.randint(0, 2)
        return {"type": "array", "items": leaf(rng), "minItems": lo,
                "maxItems": lo + rng.randint(1, 3)}
    if roll < 0.45:
        return {"anyOf": [leaf(rng), {"type": "null"}]}
    return leaf(rng)


def obj(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    keys = rng.sample(WORDS, rng.randint(2, 5))
    props = {k: value(rng, depth) for k in keys}
    required = [k for k in keys if rng.random() < 0.7] or keys[:1]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def make_cases(n: int, seed: int = 0) -> list[tuple[dict[str, Any], str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        schema = obj(rng)
        prompt = rng.choice(PROMPTS).format(schema=json.dumps(schema),
                                            topic=rng.choice(TOPICS))
        cases.append((schema, prompt))
    return cases


@dataclass
class Tally:
    valid: int = 0
    invalid: int = 0
    truncated: int = 0
    lenient_valid: int = 0
    failures: list[str] = field(default_factory=list)

    def row(self, name: str, n: int) -> str:
        done = self.valid + self.invalid
        return (f"| {name} | {n} | {self.truncated} | {done} | {self.valid} "
                f"({100 * self.valid / max(done, 1):.1f}%) | {self.lenient_valid} |")


def is_valid(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def first_object(text: str) -> str:
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if 0 <= start < end else ""


def measure(engine: Any, cases: list[tuple[dict[str, Any], str]],
            max_tokens: int) -> tuple[Tally, Tally, float]:
    """Every case constrained and free, in one batch, greedy: (constrained, free, seconds)."""
    from engine.core.sampling_params import SamplingParams
    from engine.core.structured import StructuredSpec

    tok = engine.tokenizer
    for i, (schema, prompt) in enumerate(cases):
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}],
                                                 tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)
        spec = StructuredSpec("json_schema", json.dumps(schema))
        engine.add_request(ids, SamplingParams(max_tokens=max_tokens, structured=spec),
                           request_id=f"c{i}")
        engine.add_request(ids, SamplingParams(max_tokens=max_tokens), request_id=f"f{i}")
    texts: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                reasons[out.request_id] = str(out.finish_reason)
    seconds = time.perf_counter() - start
    tallies = {"c": Tally(), "f": Tally()}
    for i, (schema, _) in enumerate(cases):
        for side, tally in tallies.items():
            rid = f"{side}{i}"
            text = tok.decode(texts.get(rid, []), skip_special_tokens=True).strip()
            if reasons[rid] == "length":
                tally.truncated += 1
            elif is_valid(text, schema):
                tally.valid += 1
            else:
                tally.invalid += 1
                tally.failures.append(text[:120])
            if is_valid(first_object(text), schema):
                tally.lenient_valid += 1
    return tallies["c"], tallies["f"], seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    args = parser.parse_args(argv)
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=args.model, max_num_seqs=args.max_num_seqs,
                                   max_model_len=2048)
    constrained, free, seconds = measure(engine, make_cases(args.cases), args.max_tokens)
    print(f"{args.cases} cases, max_tokens {args.max_tokens}, greedy, {seconds:.0f} s")
    print("| run | cases | truncated (length) | finished | valid (whole answer) | "
          "valid (first {...} in it) |")
    print("|---|---|---|---|---|---|")
    print(constrained.row("constrained (json_schema)", args.cases))
    print(free.row("free (same prompts)", args.cases))
    for text in constrained.failures[:5]:
        print("constrained but invalid:", repr(text))


if __name__ == "__main__":
    main()
