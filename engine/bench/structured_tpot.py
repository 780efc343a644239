"""`carpool bench engine --structured`: what constraining half a batch costs its TPOT.

A batch of ``--batch`` requests arrives at once, each for exactly ``--tokens`` tokens
(ignore_eos); in the constrained run half of them follow a JSON Schema that cannot close
within that many tokens (an array of at least 64 strings), so every step computes their
masks. The free run is the same batch without the constraint. The runs alternate
``--repeats`` times (other work on a shared machine shifts both alike) and the best of each
is reported: mean TPOT over the requests (time from the first token to the last, per token),
and the mask's share of the constrained run's steps (the time inside the mask application
plus the matchers' advance, over the steps' time). The goal is a ratio of at most 1.10.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from engine.core.sampling_params import SamplingParams
from engine.core.structured import StructuredSpec
from engine.llm_engine import LLMEngine

SCHEMA = {"type": "object", "properties": {"notes": {
    "type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 64}},
    "required": ["notes"], "additionalProperties": False}
PROMPT = "List short notes about the sea, as JSON."


class MaskTimer:
    """Wraps the runner's mask application and the matchers' advance, summing their time."""

    def __init__(self, engine: LLMEngine) -> None:
        import engine.runner.model_runner as mr

        self.seconds = 0.0
        self._mr, self._apply = mr, mr.apply_grammar_mask
        rows = engine.runner.grammar_rows
        self._rows, self._advance = rows, rows.advance

        def apply(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return self._apply(*a)
            finally:
                self.seconds += time.perf_counter() - t

        def advance(*a: Any) -> None:
            t = time.perf_counter()
            self._advance(*a)
            self.seconds += time.perf_counter() - t

        mr.apply_grammar_mask = apply  # type: ignore[assignment]
        rows.advance = advance  # type: ignore[method-assign,assignment]

    def close(self) -> None:
        self._mr.apply_grammar_mask = self._apply  # type: ignore[assignment]
        del self._rows.advance


def run(engine: LLMEngine, prompt: list[int], batch: int, tokens: int,
        constrained: int) -> tuple[float, float]:
    """(mean TPOT seconds, step seconds) of one batch with ``constrained`` rows constrained."""
    spec = StructuredSpec("json_schema", json.dumps(SCHEMA))
    for i in range(batch):
        params = SamplingParams(max_tokens=tokens, ignore_eos=True,
                                structured=spec if i < constrained else None)
        engine.add_request(prompt, params, request_id=f"r{i}")
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    steps = 0.0
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outs = engine.step()
        now = time.perf_counter()
        steps += now - t
        for o in outs:
            if o.new_token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
    tpots = [(last[r] - first[r]) / (tokens - 1) for r in first]
    return sum(tpots) / len(tpots), steps


def main(args: argparse.Namespace) -> int:
    engine = LLMEngine.from_kwargs(model=args.model, max_num_seqs=max(args.batch, 8))
    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                                tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    run(engine, prompt, args.batch, 8, args.batch // 2)  # warm: compile, first masks
    free, half, shares = [], [], []
    for _ in range(args.repeats):
        free.append(run(engine, prompt, args.batch, args.tokens, 0)[0])
        timer = MaskTimer(engine)
        try:
            tpot, step_s = run(engine, prompt, args.batch, args.tokens, args.batch // 2)
        finally:
            timer.close()
        half.append(tpot)
        shares.append(timer.seconds / step_s)
    best_free, best_half = min(free), min(half)
    print(f"batch {args.batch}, {args.tokens} tokens each, {args.repeats} alternating runs, "
          f"best of each (threads: {engine.runner.device.type})")
    print("| batch | TPOT (ms) |")
    print("|---|---|")
    print(f"| all {args.batch} free | {best_free * 1000:.1f} |")
    print(f"| {args.batch // 2} constrained + {args.batch - args.batch // 2} free | "
          f"{best_half * 1000:.1f} |")
    print(f"ratio {best_half / best_free:.3f} (goal <= 1.10); mask share of the constrained "
          f"run's step time {100 * min(shares):.1f}% (worst run {100 * max(shares):.1f}%)")
    return 0
