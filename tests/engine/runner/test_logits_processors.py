"""Logits processors and logprobs in the batched sampler, against straightforward per-request
reference implementations (plain Python loops over each row's tokens), and seeded draws that
stay the same whatever else (penalised, biased, min_p rows) shares the batch."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.core.sampling_params import SamplingParams
from engine.runner.logits_processors import min_p_filter, process_logits
from engine.runner.sampler import Sampler

VOCAB = 97


def _reference(row: list[float], p: SamplingParams, prompt: list[int], output: list[int],
               eos: int | None) -> list[float]:
    """One request, the way the vLLM docs describe it, token by token."""
    row = list(row)
    if len(output) < p.min_tokens:
        for t in set(p.stop_token_ids) | ({eos} if eos is not None and not p.ignore_eos else set()):
            row[t] = -math.inf
    for t, b in p.logit_bias:
        row[t] += b
    for t in range(len(row)):
        if t in prompt or t in output:
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
        count = output.count(t)
        row[t] -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
    return row


def _random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_tokens=50, temperature=rng.choice([0.0, 0.7, 1.0]),
        min_tokens=rng.choice([0, 0, 3, 20]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
        presence_penalty=rng.choice([0.0, 0.5, -1.0]),
        frequency_penalty=rng.choice([0.0, 0.3, 2.0]),
        logit_bias={rng.randrange(VOCAB): rng.uniform(-100, 100) for _ in range(rng.randrange(3))},
        stop_token_ids=rng.sample(range(VOCAB), rng.randrange(3)),
        ignore_eos=rng.random() < 0.3,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_processors_match_per_request_reference(dtype: torch.dtype) -> None:
    rng = random.Random(7)
    rows = 24
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(1), dtype=dtype) * 3
    params = [_random_params(rng) for _ in range(rows)]
    params[0] = SamplingParams()  # an untouched row in the mix
    hist = [([rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))],
             [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 30))]) for _ in range(rows)]
    eos = [rng.randrange(VOCAB) for _ in range(rows)]
    got = process_logits(logits, params, [len(h[1]) for h in hist],
                         [h if p.needs_history else None for p, h in zip(params, hist)], eos)
    for r in range(rows):
        want = _reference(logits[r].tolist(), params[r], *hist[r], eos[r])
        torch.testing.assert_close(got[r], torch.tensor(want, dtype=dtype), rtol=1e-6, atol=1e-5)
    assert torch.equal(got[0], logits[0])  # a row without processors keeps its bits


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 50.0  # EOS is by far the best
    logits[0, 6] = 40.0  # then a stop id
    p = SamplingParams(max_tokens=10, min_tokens=2, stop_token_ids=[6])
    sampler = Sampler(0)
    assert sampler.sample(logits, [p], [0], eos_ids=[5]) not in ([5], [6])
    assert sampler.sample(logits, [p], [1], eos_ids=[5]) not in ([5], [6])
    assert sampler.sample(logits, [p], [2], eos_ids=[5]) == [5]  # reached: EOS again


def test_logit_bias_forces_and_forbids_tokens() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(2))
    best = int(logits[1].argmax())
    params = [SamplingParams(logit_bias={11: 100.0}),
              SamplingParams(logit_bias={best: -100.0}),
              SamplingParams(temperature=1.0, seed=3, logit_bias={42: 100.0})]
    got = Sampler(0).sample(logits, params, [0, 0, 0])
    assert got[0] == 11 and got[1] != best and got[2] == 42


def test_min_p_keeps_tokens_above_the_fraction_of_the_best() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.12, 0.08], [0.5, 0.3, 0.12, 0.08]], dtype=torch.float64)
    kept = min_p_filter(probs, [0.2, 0.0])
    assert kept[0].nonzero().flatten().tolist() == [0, 1, 2]  # 0.08 < 0.2 * 0.5
    assert torch.equal(kept[1], probs[1])
    logits = probs[:1].log()
    draws = {Sampler(0).sample(logits, [SamplingParams(temperature=1.0, seed=s, min_p=0.7)],
                               [0])[0] for s in range(40)}
    assert draws == {0}  # only 0.5 >= 0.7 * 0.5


def test_seeded_draws_with_processors_ignore_the_rest_of_the_batch() -> None:
    rng = random.Random(3)
    mine = SamplingParams(temperature=1.0, seed=99, repetition_penalty=1.2,
                          frequency_penalty=0.5, logit_bias={3: 2.0}, min_p=0.01)
    history = ([1, 2, 3], [4, 4, 5])
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(4))
    alone = [Sampler(0).sample(row[None], [mine], [i], [history])[0] for i in range(12)]
    assert len(set(alone)) > 3
    for trial in range(3):
        others = [_random_params(rng) for _ in range(5)]
        hist = [([rng.randrange(VOCAB)], [rng.randrange(VOCAB)]) for _ in others]
        pos = trial % 6
        batch = others[:pos] + [mine] + others[pos:]
        hists = hist[:pos] + [history] + hist[pos:]
        sampler = Sampler(trial)
        for i in range(12):
            logits = torch.randn(6, VOCAB) * 3
            logits[pos] = row
            got = sampler.sample(logits, batch, [i] * 6, hists, [0] * 6)
            assert got[pos] == alone[i]


def test_logprobs_are_raw_log_softmax_with_top_alternatives() -> None:
    logits = torch.randn(3, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    params = [SamplingParams(logprobs=3, repetition_penalty=2.0), SamplingParams(),
              SamplingParams(temperature=1.0, seed=1, logprobs=0)]
    hist = [([1, 2], [3]), None, None]
    out = Sampler(0).sample_batch(logits, params, [1, 0, 0], hist)
    assert set(out.logprobs) == {0, 2}
    ref = torch.log_softmax(logits, dim=-1)
    for r in (0, 2):
        lp = out.logprobs[r]
        assert lp.logprob == pytest.approx(float(ref[r, out.tokens[r]]), abs=1e-12)
    top = torch.topk(ref[0], 3)
    assert [t for t, _ in out.logprobs[0].top] == top.indices.tolist()
    assert [v for _, v in out.logprobs[0].top] == pytest.approx(top.values.tolist(), abs=1e-12)
    assert out.logprobs[2].top == ()
