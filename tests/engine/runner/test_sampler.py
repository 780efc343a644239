"""Sampler: greedy is argmax, seeds are batch-independent, filters restrict the support, and the
draws follow the filtered distribution."""

from __future__ import annotations

import collections
import math

import torch

from engine.core.sampling_params import SamplingParams
from engine.runner.sampler import Sampler, filter_top_k_top_p

GREEDY = SamplingParams()


def _logits(rows: int, vocab: int = 1000, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_all_greedy_is_argmax_per_row() -> None:
    logits = _logits(37, seed=1)
    got = Sampler(0).sample(logits, [GREEDY] * 37, [0] * 37)
    assert got == [int(row.argmax()) for row in logits]


def test_greedy_rows_in_a_mixed_batch_are_argmax() -> None:
    logits = _logits(6, seed=2)
    params = [GREEDY, SamplingParams(temperature=1.0), GREEDY,
              SamplingParams(temperature=0.7, seed=3), GREEDY, SamplingParams(top_k=5)]
    got = Sampler(0).sample(logits, params, [0] * 6)
    for row in (0, 2, 4):
        assert got[row] == int(logits[row].argmax())


def test_seeded_draws_do_not_depend_on_batch_or_row_position() -> None:
    vocab = 500
    mine = torch.zeros(vocab, dtype=torch.float64)  # flat: every token possible
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = [Sampler(0).sample(mine[None], [params], [i])[0] for i in range(20)]
    assert len(set(alone)) > 5  # token i's draw depends on i
    others = [SamplingParams(temperature=1.0, top_k=20, top_p=0.9),
              SamplingParams(temperature=0.5, seed=7), GREEDY]
    for trial in range(3):
        sampler = Sampler(trial)  # the unseeded neighbours get different noise each trial
        for i in range(20):
            rows = torch.randn(4, vocab, dtype=torch.float64)
            pos = (i + trial) % 4
            rows[pos] = mine
            batch = others[:pos] + [params] + others[pos:]
            assert sampler.sample(rows, batch, [i, i, i, i])[pos] == alone[i]
    other_seed = [Sampler(0).sample(mine[None], [SamplingParams(temperature=1.0, seed=99)], [i])[0]
                  for i in range(20)]
    assert other_seed != alone


def test_unseeded_requests_follow_the_sampler_generator() -> None:
    logits = torch.zeros(8, 300)
    params = [SamplingParams(temperature=1.0)] * 8
    a, b = Sampler(5).sample(logits, params, [0] * 8), Sampler(5).sample(logits, params, [0] * 8)
    assert a == b
    assert len(set(a)) > 1  # rows get independent noise


def _frequencies(logits: torch.Tensor, params: SamplingParams, n: int) -> dict[int, float]:
    sampler = Sampler(0)
    counts = collections.Counter(
        sampler.sample(logits[None], [params], [0])[0] for _ in range(n)
    )
    return {tok: c / n for tok, c in counts.items()}


def test_temperature_draws_follow_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    freq = _frequencies(logits, SamplingParams(temperature=0.8), 4000)
    want = torch.softmax(logits / 0.8, dim=-1)
    for tok in range(4):
        assert math.isclose(freq.get(tok, 0.0), float(want[tok]), abs_tol=0.03)


def test_top_k_restricts_support_and_keeps_proportions() -> None:
    logits = torch.randn(200, generator=torch.Generator().manual_seed(3))
    top3 = set(torch.topk(logits, 3).indices.tolist())
    freq = _frequencies(logits, SamplingParams(temperature=1.0, top_k=3), 3000)
    assert set(freq) == top3
    p = torch.softmax(logits, -1)
    mass = sum(float(p[t]) for t in top3)
    for tok in top3:
        assert math.isclose(freq[tok], float(p[tok]) / mass, abs_tol=0.035)


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    freq = _frequencies(probs.log(), SamplingParams(temperature=1.0, top_p=0.7), 3000)
    assert set(freq) == {1, 3}  # 0.5 < 0.7, so 0.3 joins; 0.8 >= 0.7 stops
    assert math.isclose(freq[1], 0.5 / 0.8, abs_tol=0.035)


def test_filter_combines_top_k_then_top_p() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 5, dtype=torch.float64)
    kept = filter_top_k_top_p(probs, [0, 3, 3, 0, 2], [1.0, 1.0, 0.5, 0.01, 0.9])
    support = [row.nonzero().flatten().tolist() for row in kept]
    # row 2: after top-3 renormalization 0.444, 0.333, 0.222 -> p=0.5 keeps two
    assert support == [[0, 1, 2, 3], [0, 1, 2], [0, 1], [0], [0, 1]]
    assert torch.equal(kept[0], probs[0])  # untouched rows keep their exact bits
    torch.testing.assert_close(kept[1].sum(), torch.tensor(1.0, dtype=torch.float64))


def _top_p_reference(row: torch.Tensor, p: float) -> set[int]:
    values, order = row.sort(descending=True)
    above = values.cumsum(0) - values
    n = max(1, int((above < p).sum()))
    return {int(t) for t in order[:n]} | {int(t) for t in (row == values[n - 1]).nonzero()}


def test_top_p_matches_a_full_sort_reference_for_peaked_and_flat_rows() -> None:
    vocab = 5000  # larger than the first look at the best tokens, so both paths run
    gen = torch.Generator().manual_seed(0)
    probs = torch.stack([
        torch.full((vocab,), 1.0 / vocab, dtype=torch.float64),  # all tied
        torch.softmax(torch.linspace(0, 1, vocab, dtype=torch.float64), dim=-1),  # flat
        torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * 4, dim=-1),
        torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * 1, dim=-1),
    ])
    ps = [0.8, 0.8, 0.9, 0.5]
    kept = filter_top_k_top_p(probs, [0] * 4, ps)
    for row, p, got in zip(probs, ps, kept, strict=True):
        assert set(got.nonzero().flatten().tolist()) == _top_p_reference(row, p)
        assert torch.equal(got[got > 0], row[got > 0])
