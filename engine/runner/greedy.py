"""Row-wise argmax over a vocabulary, in two vectorised passes.

Contract: ``row_argmax(logits [R, V])`` returns the same int64 indices ``logits.argmax(-1)``
does, for any float dtype: the first index of each row's maximum, a NaN counting as the
maximum (so the first NaN), index 0 for a row of -inf. Why: torch's CPU argmax walks a row
one element at a time, about 1 ns a logit: 42 us per 49 152-token row on this machine,
1.3 ms a step at 32 greedy rows, 4.1 ms at 100, one thread whatever the thread count. ``amax``
is SIMD; so each row is cut into chunks of ``CHUNK`` logits, the chunks' maxima found with
``amax``, the first chunk holding the row's maximum picked (argmax over a few dozen values),
and argmax run inside that chunk only: 0.19 ms at 32 rows, 0.75 ms at 100.

Why the same index: the first chunk whose maximum equals the row's maximum holds the row's
first maximum, and argmax inside it returns that element; NaN propagates through ``amax``, so
the first chunk with a NaN, then its first NaN, are picked as argmax would.
"""

from __future__ import annotations

import torch

CHUNK = 1024


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R] int64, equal to ``logits.argmax(-1)`` (see the module docstring)."""
    rows, vocab = logits.shape
    n = vocab // CHUNK
    if rows <= 1 or n < 2:  # one row: argmax's single pass is as fast as the two here
        return logits.argmax(dim=-1)
    maxima = logits[:, : n * CHUNK].unflatten(-1, (n, CHUNK)).amax(dim=-1)
    if n * CHUNK < vocab:  # the shorter last chunk
        maxima = torch.cat([maxima, logits[:, n * CHUNK:].amax(dim=-1, keepdim=True)], dim=1)
    first = maxima.argmax(dim=-1, keepdim=True)
    # the winning chunk's columns; the last chunk's run past the vocabulary repeats the last
    # column, which comes after the real ones, so "first maximum" is unchanged
    cols = (first * CHUNK + torch.arange(CHUNK, device=logits.device)).clamp_(max=vocab - 1)
    inside = logits.gather(1, cols).argmax(dim=-1, keepdim=True)
    return cols.gather(1, inside).squeeze(1)
