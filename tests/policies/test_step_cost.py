"""The step-cost model against numpy's least squares on synthetic steps with noise."""

from __future__ import annotations

import numpy as np
import pytest

from policies.step_cost import StepCost, StepCostModel, nnls


def synthetic_steps(rng: np.random.Generator, n: int, coef: tuple[float, float, float, float],
                    noise: float) -> np.ndarray:
    """Rows of (rows, tokens, kv_tokens, seconds): decode-heavy steps, some with prefill."""
    rows = rng.integers(1, 64, n)
    tokens = rows + rng.integers(0, 2, n) * rng.integers(0, 512, n)  # some steps carry a prefill
    kv = rows * rng.integers(16, 600, n)
    a, b, c, d = coef
    seconds = a + b * rows + c * tokens + d * kv + rng.normal(0, noise, n)
    return np.column_stack([rows, tokens, kv, seconds])


def fed(data: np.ndarray, **kw: int) -> StepCostModel:
    model = StepCostModel(**kw)
    for r, t, kv, s in data:
        model.observe(int(r), int(t), int(kv), float(s))
    model.fit()
    return model


def design(data: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1], data[:, 2]])


def test_fit_matches_lstsq_when_the_truth_is_positive() -> None:
    rng = np.random.default_rng(1)
    data = synthetic_steps(rng, 400, (0.02, 0.004, 0.0005, 2e-6), noise=0.002)
    model = fed(data)
    ref, *_ = np.linalg.lstsq(design(data), data[:, 3], rcond=None)
    assert np.all(ref > 0)  # the premise: unconstrained lstsq is already feasible here
    got = model.cost
    assert np.allclose([got.base, got.per_row, got.per_token, got.per_kv_token], ref,
                       rtol=1e-6, atol=1e-12)
    assert model.predict(10, 10, 3000) == pytest.approx(ref @ [1, 10, 10, 3000])


def test_coefficients_stay_non_negative_and_optimal() -> None:
    """Truth has no per-token cost, so noisy lstsq goes negative; the fit must not, and must
    satisfy the KKT conditions of non-negative least squares (an independent check)."""
    negative = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        data = synthetic_steps(rng, 200, (0.01, 0.003, 0.0, 1e-6), noise=0.004)
        x, y = design(data), data[:, 3]
        w = nnls(x, y)
        assert np.all(w >= 0)
        grad = x.T @ (x @ w - y)
        scale = np.linalg.norm(x, axis=0) * np.linalg.norm(y)
        for g, wi, s in zip(grad, w, scale):
            if wi > 0:
                assert abs(g) <= 1e-7 * s  # stationary along a free coefficient
            else:
                assert g >= -1e-7 * s  # moving it above zero would not help
        ref, *_ = np.linalg.lstsq(x, y, rcond=None)
        negative += bool(np.any(ref < 0))
        assert np.sum((x @ w - y) ** 2) >= np.sum((x @ ref - y) ** 2) - 1e-12
    assert negative >= 5  # the premise: the constraint matters in many of these cases


def test_few_samples_fall_back_to_the_per_row_mean() -> None:
    model = StepCostModel(min_samples=16)
    assert model.fit() == StepCost()  # no data: nothing predicted
    steps = [(4, 4, 400, 0.2), (8, 8, 900, 0.5), (2, 2, 100, 0.09)]
    for r, t, kv, s in steps:
        model.observe(r, t, kv, s)
    model.observe(0, 0, 0, 1.0)  # an empty step is ignored
    cost = model.fit()
    per_row = np.mean([s / r for r, _, _, s in steps])
    assert cost == StepCost(per_row=pytest.approx(per_row))
    assert model.predict(6, 6, 600) == pytest.approx(6 * per_row)


def test_window_forgets_the_old_regime() -> None:
    rng = np.random.default_rng(3)
    slow = synthetic_steps(rng, 300, (0.05, 0.02, 0.001, 1e-5), noise=0.0)
    fast = synthetic_steps(rng, 100, (0.01, 0.002, 0.0001, 1e-6), noise=0.0)
    model = fed(np.vstack([slow, fast]), window=100)
    assert model.predict(10, 10, 2000) == pytest.approx(0.01 + 0.02 + 0.001 + 0.002)


def test_predictions_grow_with_every_input() -> None:
    rng = np.random.default_rng(4)
    model = fed(synthetic_steps(rng, 300, (0.02, 0.003, 0.0002, 1e-6), noise=0.003))
    base = model.predict(8, 8, 2000)
    assert model.predict(9, 8, 2000) >= base
    assert model.predict(8, 9, 2000) >= base
    assert model.predict(8, 8, 2100) >= base
    decode = [model.predict_decode(r, 300) for r in range(1, 100)]
    assert decode == sorted(decode)


def test_max_rows_within_is_the_largest_row_count_under_the_target() -> None:
    rng = np.random.default_rng(5)
    model = fed(synthetic_steps(rng, 300, (0.02, 0.003, 0.0002, 1e-6), noise=0.003))
    for target in (0.0, 0.01, 0.03, 0.05, 0.1, 0.27, 1.0):
        for kv in (0.0, 100.0, 1000.0):
            rows = model.max_rows_within(target, kv_per_row=kv, limit=10_000)
            brute = max((r for r in range(10_001) if model.predict_decode(r, kv) <= target),
                        default=0)
            assert rows == brute, (target, kv)
    smaller = [model.max_rows_within(t, kv_per_row=200) for t in (0.05, 0.1, 0.2, 0.4)]
    assert smaller == sorted(smaller)
    # the default context per row is the observed one
    assert model.max_rows_within(0.1) == model.max_rows_within(0.1, model.mean_kv_per_row())


def test_max_rows_with_no_marginal_cost_is_the_limit() -> None:
    model = StepCostModel(min_samples=1)
    assert model.max_rows_within(0.5, limit=64) == 64  # nothing known: nothing to cap


def test_a_cost_per_prefill_row_is_fitted_beside_the_four() -> None:
    """Steps that report their prefill rows: the fit matches numpy's lstsq on five columns,
    and a decode step's prediction does not carry the prefill rows' cost."""
    rng = np.random.default_rng(7)
    data = synthetic_steps(rng, 400, (0.02, 0.004, 0.0005, 2e-6), noise=0.0)
    prefill = (data[:, 1] > data[:, 0]).astype(float)  # a step with a prompt chunk: one row
    data[:, 3] += 0.019 * prefill + rng.normal(0, 0.002, len(data))
    model = StepCostModel()
    for (r, t, kv, s), p in zip(data, prefill):
        model.observe(int(r), int(t), int(kv), float(s), int(p))
    got = model.fit()
    ref, *_ = np.linalg.lstsq(np.column_stack([design(data), prefill]), data[:, 3], rcond=None)
    assert np.all(ref > 0)  # the premise: unconstrained lstsq is already feasible here
    assert np.allclose([got.base, got.per_row, got.per_token, got.per_kv_token,
                        model.per_prefill_row], ref, rtol=1e-6, atol=1e-12)
    assert model.predict_decode(10, 300) == pytest.approx(ref[:4] @ [1, 10, 10, 3000])
