"""kernels.cpu_small_linear: the small-batch fp32 linear against F.linear in float64 (to fp32
rounding), and the two properties its construction promises bit for bit: an output does not
depend on the thread count nor on the other rows of the batch (each output is one thread's
in-order sum over k, vectorised across outputs, never across k)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_linear, cpu_small_linear

pytestmark = pytest.mark.skipif(not cpu_small_linear.available(),
                                reason="small-batch linear op not built (make setup)")


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 33])  # row groups of 8 and their remainders
@pytest.mark.parametrize(("n", "k"), [(1000, 576), (17, 64), (64, 1536), (33, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(m: int, n: int, k: int, bias: bool) -> None:
    torch.manual_seed(m * 1000 + n)
    w = torch.randn(n, k) / k**0.5
    b = torch.randn(n) if bias else None
    x = torch.randn(m, k)
    got = cpu_small_linear.linear(x, cpu_small_linear.pack(w), b, n)
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(x, w, b), rtol=1e-4, atol=1e-5)


def test_strided_rows_and_transposed_weight_view() -> None:
    """Rows of a wider tensor (q of a qkv output) and the model's input-major weight views."""
    torch.manual_seed(1)
    w = torch.randn(96, 40).t().contiguous().t()
    x = torch.randn(5, 100)[:, 10:50]
    got = cpu_small_linear.linear(x, cpu_small_linear.pack(w), None, 96)
    torch.testing.assert_close(got.double(), reference(x, w, None), rtol=1e-4, atol=1e-5)


def test_same_bits_at_any_thread_count_and_batch() -> None:
    torch.manual_seed(2)
    w, x = torch.randn(300, 576), torch.randn(12, 576)
    packed = cpu_small_linear.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_small_linear.linear(x, packed, None, 300)
        torch.set_num_threads(2)
        two = cpu_small_linear.linear(x, packed, None, 300)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    alone = torch.cat([cpu_small_linear.linear(x[i:i + 1], packed, None, 300) for i in range(12)])
    assert torch.equal(alone, two)


def test_bad_shapes_raise() -> None:
    packed = cpu_small_linear.pack(torch.randn(40, 16))
    with pytest.raises(RuntimeError, match="packed"):
        cpu_small_linear.linear(torch.randn(2, 15), packed, None, 40)
    with pytest.raises(RuntimeError, match="packed"):
        cpu_small_linear.linear(torch.randn(2, 16), packed, None, 70)
    with pytest.raises(RuntimeError, match="bias"):
        cpu_small_linear.linear(torch.randn(2, 16), packed, torch.randn(39), 40)
    with pytest.raises(RuntimeError, match="fp32"):
        cpu_small_linear.linear(torch.randn(2, 16, dtype=torch.float64), packed, None, 40)


def test_routed_linear_takes_it_up_to_max_rows_and_onednn_above(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 80)
    routed = cpu_linear.OneDNNLinear(lin)
    calls: list[int] = []
    real = cpu_small_linear.linear

    def counting(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_small_linear, "linear", counting)
    for m in (1, cpu_small_linear.MAX_ROWS, cpu_small_linear.MAX_ROWS + 1):
        x = torch.randn(m, 64)
        torch.testing.assert_close(routed(x).double(), reference(x, lin.weight, lin.bias),
                                   rtol=1e-4, atol=1e-5)
    assert calls == [1, cpu_small_linear.MAX_ROWS]


def test_threads_calling_at_once_each_get_their_own_result() -> None:
    """Two engines in one process may step at once: the pool serves one caller, the other
    runs alone, and neither sees the other's rows."""
    import threading

    torch.manual_seed(4)
    w = torch.randn(2000, 256)
    packed = cpu_small_linear.pack(w)
    xs = [torch.randn(4, 256) for _ in range(4)]
    expected = [cpu_small_linear.linear(x, packed, None, 2000) for x in xs]
    failures: list[int] = []

    def hammer(i: int) -> None:
        for _ in range(50):
            if not torch.equal(cpu_small_linear.linear(xs[i], packed, None, 2000), expected[i]):
                failures.append(i)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


@pytest.mark.parametrize("n, k, aligned", [(1000, 300, True), (100, 40, False)])
def test_packed_weight_keeps_its_values_and_a_big_one_starts_on_a_2mb_boundary(
    n: int, k: int, aligned: bool
) -> None:
    # a weight of 1 MB or more is 2 MB aligned and advised before the first touch, so
    # transparent huge pages can back it; a smaller one takes ordinary memory
    weight = torch.randn(n, k)
    packed = cpu_small_linear.pack(weight)
    tiles = (n + 31) // 32
    assert (packed.data_ptr() % (2 << 20) == 0) or not aligned
    assert packed.shape == (tiles, k, 32) and packed.is_contiguous()
    want = torch.zeros(tiles * 32, k)
    want[:n] = weight
    assert torch.equal(packed, want.view(tiles, 32, k).transpose(1, 2))
