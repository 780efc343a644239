"""Greedy output of the whole engine equals transformers' own ``generate``, token for token
(float64 on both sides), under every scheduling regime: one continuous batch, chunked prefill,
preemption by recompute and by swap, requests arriving mid-run, shared prefixes; and a request
alone equals the same request inside a mixed batch of 32."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.runner.helpers import hf_model

TINY_MAX_TOKENS = 8
SMOL_MAX_TOKENS = 5
SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
SMOL_TEXTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "Explain in one sentence why the sky is blue, please.",
]

# name -> engine options; each regime must also show that it really happened (see _assert_regime)
REGIMES: dict[str, dict[str, Any]] = {
    "continuous": {},
    "chunked_prefill": {"max_num_batched_tokens": 8},
    "preempt_recompute": {"num_blocks": 14, "preemption_mode": "recompute"},
    "preempt_swap": {"num_blocks": 14, "num_cpu_blocks": 64, "preemption_mode": "swap"},
}


def _tiny_prompts(n: int = 16, seed: int = 0, prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 3, 5, 7, 8, 11, 13, 16, 17, 19, 23, 24, 29, 31, 37][:n]
    return [(prefix or []) + [rng.randrange(3, 49152) for _ in range(k)] for k in lengths]


def _hf_greedy(model: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                do_sample=False,
            )
        out.append(gen[0, len(prompt):].tolist())
    return out


def _llm(model_dir: Path, **options: Any) -> LLM:
    kw: dict[str, Any] = {"block_size": 4, "num_blocks": 256, "num_cpu_blocks": 0}
    kw.update(options)
    return LLM(model=str(model_dir), dtype="float64", **kw)


def _generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens))
    return [o.token_ids for o in outs]


def _assert_regime(name: str, llm: LLM) -> None:
    stats = llm.engine.stats
    if name == "preempt_recompute":
        assert stats.preemptions_recompute > 0
    if name == "preempt_swap":
        assert stats.preemptions_swap > 0


@pytest.fixture(scope="module")
def smol_prompts(smollm2_dir: Path) -> list[list[int]]:
    """Chat-style prompts sharing a system prefix (so prefix caching has something to share)."""
    from engine.runner.loader import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    return [tok.encode(SMOL_SYSTEM + t, add_special_tokens=False) for t in SMOL_TEXTS]


@pytest.fixture(scope="module")
def tiny_expected(tiny_model_dir: Path) -> list[list[int]]:
    return _hf_greedy(hf_model(tiny_model_dir), _tiny_prompts(), TINY_MAX_TOKENS)


@pytest.fixture(scope="module")
def smol_expected(smollm2_dir: Path, smol_prompts: list[list[int]]) -> list[list[int]]:
    return _hf_greedy(hf_model(smollm2_dir), smol_prompts, SMOL_MAX_TOKENS)


@pytest.mark.parametrize("regime", list(REGIMES))
def test_tiny_llama_matches_transformers(
    regime: str, tiny_model_dir: Path, tiny_expected: list[list[int]]
) -> None:
    if regime == "chunked_prefill":
        assert max(len(p) for p in _tiny_prompts()) > REGIMES[regime]["max_num_batched_tokens"]
    llm = _llm(tiny_model_dir, **REGIMES[regime])
    assert _generate(llm, _tiny_prompts(), TINY_MAX_TOKENS) == tiny_expected
    _assert_regime(regime, llm)


# SmolLM2 in fp64 costs seconds per engine, so its regimes are paired: each run forces both
# of its regimes and asserts that both really happened.
SMOL_REGIMES: dict[str, dict[str, Any]] = {
    "continuous": {},
    "chunked_prefill+preempt_recompute": {
        "max_num_batched_tokens": 16, "num_blocks": 9, "preemption_mode": "recompute"},
    "chunked_prefill+preempt_swap": {
        "max_num_batched_tokens": 16, "num_blocks": 9, "num_cpu_blocks": 64,
        "preemption_mode": "swap"},
}


@pytest.mark.slow
@pytest.mark.parametrize("regime", list(SMOL_REGIMES))
def test_smollm2_matches_transformers(
    regime: str, smollm2_dir: Path, smol_prompts: list[list[int]],
    smol_expected: list[list[int]],
) -> None:
    options = SMOL_REGIMES[regime]
    if "chunked" in regime:  # every prompt is longer than the budget: all must be split
        assert min(len(p) for p in smol_prompts) > options["max_num_batched_tokens"]
    llm = _llm(smollm2_dir, **options)
    assert _generate(llm, smol_prompts, SMOL_MAX_TOKENS) == smol_expected
    for part in regime.split("+"):
        _assert_regime(part, llm)


def _staggered(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Two requests first; then one more arrives after every step while the others run."""
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens)
    tokens: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    ids: dict[int, str] = {}
    for i, prompt in pending[:2]:
        ids[i] = engine.add_request(prompt, params)
    pending = pending[2:]
    overlapped = False
    while engine.has_unfinished_requests() or pending:
        if pending and engine.has_unfinished_requests():
            overlapped = True
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if pending:
            i, prompt = pending.pop(0)
            ids[i] = engine.add_request(prompt, params)
    assert overlapped
    return [tokens[ids[i]] for i in range(len(prompts))]


def test_tiny_llama_requests_arriving_while_others_run(
    tiny_model_dir: Path, tiny_expected: list[list[int]]
) -> None:
    llm = _llm(tiny_model_dir, max_num_batched_tokens=16)
    assert _staggered(llm, _tiny_prompts(), TINY_MAX_TOKENS) == tiny_expected


@pytest.mark.slow
def test_smollm2_arrivals_while_others_run_share_the_prefix(
    smollm2_dir: Path, smol_prompts: list[list[int]], smol_expected: list[list[int]]
) -> None:
    llm = _llm(smollm2_dir)
    assert _staggered(llm, smol_prompts, SMOL_MAX_TOKENS) == smol_expected
    assert llm.engine.stats.prefix_cache_hits >= 12  # later arrivals reuse the system prompt


def test_tiny_llama_prefix_shared_prompts(tiny_model_dir: Path) -> None:
    shared = _tiny_prompts(1, seed=9)[0] + list(range(100, 112))  # 13 tokens: 3 full blocks
    prompts = _tiny_prompts(16, seed=10, prefix=shared)
    expected = _hf_greedy(hf_model(tiny_model_dir), prompts, TINY_MAX_TOKENS)
    llm = _llm(tiny_model_dir)
    first = _generate(llm, prompts[:1], TINY_MAX_TOKENS)  # fills the prefix cache
    rest = _generate(llm, prompts[1:], TINY_MAX_TOKENS)
    assert first + rest == expected
    assert llm.engine.stats.prefix_cache_hits >= 12 * 15


def test_tiny_llama_repeated_prompts_reuse_partial_blocks(
    tiny_model_dir: Path, tiny_expected: list[list[int]]
) -> None:
    """The same prompts again: every one is computed from its last token only (whole blocks
    shared, the rest copied from the cached block that holds it, the first run's output
    tokens included), and the output is still transformers'."""
    prompts = _tiny_prompts()
    llm = _llm(tiny_model_dir)
    assert _generate(llm, prompts, TINY_MAX_TOKENS) == tiny_expected
    hits = llm.engine.stats.prefix_cache_hits
    assert _generate(llm, prompts, TINY_MAX_TOKENS) == tiny_expected
    assert llm.engine.stats.prefix_cache_hits - hits == sum(len(p) - 1 for p in prompts)


def test_alone_equals_inside_a_mixed_batch_of_32(tiny_model_dir: Path) -> None:
    """Greedy and seeded-sampling requests give the same tokens alone and in a mixed batch."""
    target = _tiny_prompts(16, seed=3)[9]
    greedy = SamplingParams(max_tokens=TINY_MAX_TOKENS)
    seeded = SamplingParams(max_tokens=TINY_MAX_TOKENS, temperature=0.9, top_p=0.95, seed=42)
    alone = _llm(tiny_model_dir).generate([target, target], [greedy, seeded])
    assert alone[0].token_ids != alone[1].token_ids  # the seeded one really samples
    others = _tiny_prompts(16, seed=4) + _tiny_prompts(14, seed=5)
    mixed_params = [
        SamplingParams(max_tokens=3 + i % 9, temperature=0.0 if i % 3 else 0.9,
                       top_k=0 if i % 2 else 20, seed=i if i % 4 == 0 else None)
        for i in range(len(others))
    ]
    prompts = others[:13] + [target] + others[13:20] + [target] + others[20:]
    params = mixed_params[:13] + [greedy] + mixed_params[13:20] + [seeded] + mixed_params[20:]
    assert len(prompts) == 32
    outs = _llm(tiny_model_dir, max_num_batched_tokens=64).generate(prompts, params)
    assert outs[13].token_ids == alone[0].token_ids
    assert outs[21].token_ids == alone[1].token_ids
