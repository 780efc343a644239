"""kernels.greedy_head: the screened greedy head gives exactly the token the full fp32 head's
argmax gives (the first maximum), on random heads and on heads built so that fp16 cannot tell
the best outputs apart (duplicated and one-ulp-apart rows), and the bound it screens with
holds between the fp32 and the fp16-weight logits. Reference: ``cpu_small_linear.linear``
(the full head the engine runs at these row counts) and torch's argmax."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_small_linear, greedy_head
from kernels.greedy_head import ScreenedHead

pytestmark = pytest.mark.skipif(
    not cpu_small_linear.available() or not cpu_small_linear.has_half(),
    reason="small-batch linear op not built with fp16 loads (make setup; needs F16C)")


def make_head(n: int = 4000, k: int = 576, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(n, k) * 0.05


def full_argmax(w: torch.Tensor, x: torch.Tensor) -> list[int]:
    logits = cpu_small_linear.linear(x, cpu_small_linear.pack(w), None, w.shape[0])
    return [int(i) for i in logits.argmax(dim=-1)]


def screened(w: torch.Tensor) -> ScreenedHead:
    head = ScreenedHead.of(w, cpu_small_linear.pack(w))
    assert head is not None
    return head


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(4000, 576), (49, 64), (1000, 33)])
def test_random_heads_give_the_full_heads_argmax(m: int, n: int, k: int) -> None:
    w = make_head(n, k, seed=m + n)
    head = screened(w)
    for trial in range(5):
        x = torch.randn(m, k) * (1 + trial)
        assert head.tokens(x) == full_argmax(w, x)


def test_ties_give_the_first_maximum() -> None:
    w = make_head()
    x = torch.randn(1, w.shape[1])
    best = full_argmax(w, x)[0]
    n = w.shape[0]
    for early in (0, 5, (best - 1) % n):
        tied = w.clone()
        tied[early] = w[best]
        tied[(best + 7) % n] = w[best]
        first = min(early, best, (best + 7) % n)
        assert full_argmax(tied, x) == [first]
        assert screened(tied).tokens(x) == [first]


def test_rows_fp16_cannot_tell_apart() -> None:
    """The best row and copies of it one fp32 ulp larger or smaller in a few weights: their
    fp16 copies are equal, so the choice is made by the fp32 confirmation alone."""
    w = make_head(n=512)
    x = torch.randn(3, w.shape[1]).abs()  # positive inputs: a larger weight, a larger logit
    for r in range(3):
        best = full_argmax(w, x[r:r + 1])[0]
        near = w.clone()
        up = torch.nextafter(w[best, :4], torch.full((4,), 1.0))
        down = torch.nextafter(w[best, :4], torch.full((4,), -1.0))
        near[(best + 1) % 512, :] = w[best]
        near[(best + 1) % 512, :4] = up
        near[(best + 2) % 512, :] = w[best]
        near[(best + 2) % 512, :4] = down
        assert torch.equal(near.half()[best], near.half()[(best + 1) % 512])
        xr = x[r:r + 1]
        assert screened(near).tokens(xr) == full_argmax(near, xr)


def test_the_bound_holds_between_fp32_and_fp16_logits() -> None:
    """What the screen relies on: |fp32 logit - fp16-weight logit| <= C ||x||_2 for every
    output (the fp16 logits computed here by the fp32 kernel on the fp16 values, which it
    widens exactly, as the screen does)."""
    w = make_head(n=2000)
    bound, max_norm = greedy_head.screen_bounds(w, greedy_head.half_pack(w))
    fp16_values = w.half().float()
    for seed in range(4):
        torch.manual_seed(seed)
        x = torch.randn(4, w.shape[1]) * 10 ** seed
        assert bool((x.double().norm(dim=1) <= max_norm).all())
        exact = cpu_small_linear.linear(x, cpu_small_linear.pack(w), None, w.shape[0])
        approx = cpu_small_linear.linear(x, cpu_small_linear.pack(fp16_values), None, w.shape[0])
        gap = (exact.double() - approx.double()).abs().amax(dim=1)
        assert (gap <= bound * x.double().norm(dim=1)).all()
        assert (gap > 0).any()  # the two heads differ: the check is not vacuous


def test_what_it_does_not_decide() -> None:
    w = make_head()
    head = screened(w)
    k = w.shape[1]
    assert head.tokens(torch.randn(greedy_head.MAX_ROWS + 1, k)) is None  # too many rows
    bad = torch.randn(2, k)
    bad[1, 3] = float("nan")
    assert head.tokens(bad) is None  # a NaN row: the full head decides (NaN is argmax there)
    inf = torch.randn(1, k)
    inf[0, 0] = float("inf")
    assert head.tokens(inf) is None
    past = torch.full((1, k), 1e36)
    assert float(past.double().norm()) > head.max_norm
    assert head.tokens(past) is None  # past max_norm: partial sums could overflow
    assert head.tokens(torch.zeros(1, k)) is None  # every output ties: too many candidates
    huge = w.clone()
    huge[0, 0] = 1e6  # beyond fp16: no screen at all
    assert ScreenedHead.of(huge, cpu_small_linear.pack(huge)) is None
    assert ScreenedHead.of(w.double(), None) is None


def test_fp16_order_is_not_the_fp32_order() -> None:
    """Row A is best in fp32, but its fp16 copy rounds down and a rival's rounds up, so the
    rival screens higher: only a screen that keeps everything within its bound finds A.
    With x = e0 + e1: A = (p + .49u, q + .49u) -> fp16 (p, q); B = (p, q + .51u) -> (p, q + u)
    (u: fp16's spacing at p = q = 0.5); fp32 A - B = .47u > 0, fp16 A - B = -u."""
    w = make_head()
    u = 2.0 ** -11
    a, b = 10, 3000
    w[a, :2] = torch.tensor([0.5 + 0.49 * u, 0.5 + 0.49 * u])
    w[b, :2] = torch.tensor([0.5, 0.5 + 0.51 * u])
    x = torch.zeros(1, w.shape[1])
    x[0, :2] = 1.0
    half = w.half().float()
    assert float(half[b, :2].sum()) > float(half[a, :2].sum())  # the rival screens higher
    assert full_argmax(w, x) == [a]
    assert screened(w).tokens(x) == [a]
