"""row_argmax equals torch's argmax: random rows, ties, NaN and -inf rows, vocabularies that
are not a multiple of the chunk, every float dtype the engine runs."""

from __future__ import annotations

import pytest
import torch

from engine.runner.greedy import CHUNK, row_argmax


@pytest.mark.parametrize("vocab", [CHUNK * 3, CHUNK * 3 + 17, 49152, 2 * CHUNK - 1, CHUNK // 2])
@pytest.mark.parametrize("rows", [1, 2, 9])
def test_random_rows_equal_argmax(vocab: int, rows: int) -> None:
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab + rows))
    assert torch.equal(row_argmax(x), x.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_ties_pick_the_first_maximum(dtype: torch.dtype) -> None:
    # few distinct values: every row has its maximum many times, across chunks
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (16, CHUNK * 5 + 3), generator=g).to(dtype)
    x[3, -1] = 9  # the maximum alone in the short last chunk
    x[4, CHUNK * 5 - 1] = 9  # ... at the last column of a full chunk
    x[5, :] = 1  # a flat row
    assert torch.equal(row_argmax(x), x.argmax(-1))


def test_nan_and_minus_inf_rows_follow_argmax() -> None:
    x = torch.randn(6, CHUNK * 4 + 5, generator=torch.Generator().manual_seed(2))
    x[0, CHUNK * 2 + 7] = float("nan")
    x[1, 5] = x[1, CHUNK * 3] = float("nan")
    x[2, :] = float("-inf")
    x[3, -2] = float("nan")  # in the short last chunk
    x[4, :] = float("inf")
    assert torch.equal(row_argmax(x), x.argmax(-1))
