"""kernels.cpu_int8_linear: the quantizer's contract, and the int8 small-batch linear against
F.linear in float64 on the dequantized weight (to fp32 rounding) at row counts on both sides of
the tile widening, with the bits of a row independent of the thread count and of its batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_small_linear
from kernels.cpu_int8_linear import QMAX, Int8Linear, quantize

built = pytest.mark.skipif(not cpu_small_linear.available(),
                           reason="small-batch linear op not built (make setup)")


def dequantized(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double()[:, None]


def test_quantize_rounds_each_row_to_its_own_scale() -> None:
    torch.manual_seed(0)
    w = torch.randn(40, 70) * torch.logspace(-3, 1, 40)[:, None]  # rows of very different size
    w[7] = 0.0
    q, scale = quantize(w)
    assert q.dtype == torch.int8 and scale.shape == (40,) and scale.dtype == torch.float32
    assert int(q.abs().max()) == QMAX and bool((q[7] == 0).all())
    err = (w.double() - dequantized(q, scale)).abs()
    assert bool((err <= scale.double()[:, None] / 2 * (1 + 1e-6)).all())
    assert bool((q.abs().amax(1)[torch.arange(40) != 7] == QMAX).all())  # each row uses its range


def test_quantize_refuses_non_finite_and_keeps_a_tiny_row_finite() -> None:
    w = torch.ones(3, 8)
    w[1] = 1e-44  # amax / 127 underflows to 0: that row rounds to zeros at scale 1
    q, scale = quantize(w)
    assert bool(torch.isfinite(scale).all()) and float(scale[1]) == 1.0 and bool((q[1] == 0).all())
    w[2, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        quantize(w)


@built
def test_a_zero_row_gives_its_bias() -> None:
    w = torch.randn(40, 64)
    w[5] = 0.0
    q, scale = quantize(w)
    b = torch.randn(40)
    for m in (1, 40):
        out = cpu_small_linear.linear_int8(torch.randn(m, 64), cpu_small_linear.pack_int8(q),
                                           scale, b, 40)
        assert bool((out[:, 5] == b[5]).all())


@built
@pytest.mark.parametrize("m", [1, 3, 7, 9, 17, 32, 33, 50])  # direct and widened tiles
@pytest.mark.parametrize(("n", "k"), [(1000, 576), (17, 64), (64, 1536), (33, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear_on_the_dequantized_weight(m: int, n: int, k: int, bias: bool) -> None:
    torch.manual_seed(m * 1000 + n)
    q, scale = quantize(torch.randn(n, k) / k**0.5)
    b = torch.randn(n) if bias else None
    x = torch.randn(m, k)
    got = cpu_small_linear.linear_int8(x, cpu_small_linear.pack_int8(q), scale, b, n)
    assert got.shape == (m, n) and got.dtype == torch.float32
    ref = F.linear(x.double(), dequantized(q, scale), None if b is None else b.double())
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5)


@built
def test_same_bits_at_any_thread_count_and_batch() -> None:
    torch.manual_seed(2)
    q, scale = quantize(torch.randn(300, 576))
    x = torch.randn(40, 576)  # past the rows from which a tile is widened
    packed = cpu_small_linear.pack_int8(q)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_small_linear.linear_int8(x, packed, scale, None, 300)
        torch.set_num_threads(2)
        two = cpu_small_linear.linear_int8(x, packed, scale, None, 300)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    alone = torch.cat([cpu_small_linear.linear_int8(x[i:i + 1], packed, scale, None, 300)
                       for i in range(40)])
    assert torch.equal(alone, two)  # 1 row reads int8 directly, 40 rows a widened tile


@pytest.mark.parametrize("m", [2, 50])  # the int8 tiles; oneDNN on the dequantized weight
def test_int8_linear_module(m: int) -> None:
    torch.manual_seed(3)
    src = torch.nn.Linear(96, 130)
    layer = Int8Linear(src.weight, src.bias)
    if cpu_small_linear.available():
        assert layer.small is not None and layer.small.dtype == torch.int8
    q, scale = quantize(src.weight)
    x = torch.randn(m, 96)
    ref = F.linear(x.double(), dequantized(q, scale), src.bias.double())
    torch.testing.assert_close(layer(x).double(), ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.weight().double(), dequantized(q, scale))
