"""Greedy tokens from the fp32 LM head while reading it at half the bytes: every logit is
screened on an fp16 copy of the head, and only the few that could be the maximum are computed
in fp32, by the same kernel the full head runs. The token is the one the fp32 logits' argmax
gives, bit for bit (the first index of the maximum), never an approximation.

Why: at one to a few decoding rows a step streams every weight once, and SmolLM2's head
(49 152 x 576, tied to the embeddings) is 113 MB of the step's 540: a fifth of one stream's
token time. Read as fp16 it is 57 MB; the screen leaves ~1 candidate a row (2 at most over the
rows measured), so the confirmation reads one 74 KB tile.

Why it is exact: for every output j, with h_j the fp16 row and w_j the fp32 one,
|fp32 logit_j - screened logit_j| <= ||w_j - h_j||_2 ||x||_2 (Cauchy-Schwarz) plus each dot
product's rounding, <= gamma_K (||w_j||_2 + ||h_j||_2) ||x||_2 (a K-term FMA chain,
gamma_K = K u / (1 - K u), u = 2^-24), plus K 2^-149 where partial sums fall among the
subnormals. ``bound`` is the largest such coefficient over j (with a margin), C, so every fp32
maximizer has a screened logit within 2 (C ||x||_2 + K 2^-149) of the screened maximum: those
are the candidates, and the first maximum among their fp32 logits is the row's token. The
rounding model needs no overflow: ``max_norm`` caps ||x||_2 so that no partial sum can pass
1e37. A row with a non-finite value, a larger norm, or candidates in more than an eighth of
the head's tiles returns -1 and the caller runs the full head.

The token is the one the full head gives at the same rows: at up to ``MAX_ROWS`` rows it runs
the same kernel, whose outputs do not depend on the other rows of the call.

Contract: ``ScreenedHead.of(weight, packed)`` (``packed`` the small-batch op's fp32 copy) or
None where it cannot apply (the op not built, no F16C, weights beyond fp16's range);
``tokens(x [M, K] fp32)`` -> list of M token ids, or None when a row was undecidable. Rows:
at most ``MAX_ROWS`` (beyond, the screen's FMAs outgrow the bytes it saves).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import cpu_small_linear

MAX_ROWS = 4
_FP16_MAX = 65504.0
_U = 2.0 ** -24  # fp32 unit roundoff
_MARGIN = 1.0 + 1e-6  # over the bound's own float64 arithmetic
_SUM_LIMIT = 1e37  # partial sums stay this far below fp32's overflow (3.4e38)
_CHUNK = 4096  # rows of the head at a time in float64 (a large vocabulary's head is GBs)


def half_pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] fp32 -> fp16 [ceil(N/32), K, 32], laid out (and paged) as ``cpu_small_linear.pack``
    lays fp32."""
    packed: torch.Tensor = cpu_small_linear.pack_as(weight.detach().contiguous(), True)
    return packed


def screen_bounds(weight: torch.Tensor, half: torch.Tensor) -> tuple[float, float]:
    """(C, max_norm): |fp32 logit - screened logit| <= C ||x||_2 for every output (module
    docstring) while ||x||_2 <= max_norm, under which no partial sum of either dot product
    can overflow (each is at most ||w_j||_2 ||x||_2 by Cauchy-Schwarz). ``half``: the screen's
    own packed fp16 values, so the bound is of the copy it reads."""
    n, k = weight.shape
    rows = half.transpose(1, 2).reshape(-1, k)[:n]  # packed -> [N, K] (padding rows last)
    gamma = k * _U / (1 - k * _U)
    c = largest = 0.0
    for r0 in range(0, n, _CHUNK):
        w = weight[r0:r0 + _CHUNK].detach().to(torch.float64)
        h = rows[r0:r0 + _CHUNK].to(torch.float64)
        wn, hn = w.norm(dim=1), h.norm(dim=1)
        c = max(c, float(((w - h).norm(dim=1) + gamma * (wn + hn)).max()))
        largest = max(largest, float(torch.maximum(wn, hn).max()))
    return c * _MARGIN, _SUM_LIMIT / max(largest, 1e-30)


@dataclass(frozen=True)
class ScreenedHead:
    packed: torch.Tensor  # the small-batch op's fp32 [tiles, K, 32]
    half: torch.Tensor  # fp16, same layout
    out_features: int
    bound: float  # C of screen_bounds
    max_norm: float  # the largest ||x||_2 the bound holds for

    @classmethod
    def of(cls, weight: torch.Tensor, packed: torch.Tensor | None) -> ScreenedHead | None:
        if (packed is None or not cpu_small_linear.available() or weight.dtype != torch.float32
                or weight.shape[0] == 0 or not cpu_small_linear.has_half()):
            return None
        low, high = torch.aminmax(weight.detach())
        if not bool(torch.maximum(-low, high) <= _FP16_MAX):  # also False for a NaN
            return None
        half = half_pack(weight)
        bound, max_norm = screen_bounds(weight, half)
        return cls(packed, half, weight.shape[0], bound, max_norm)

    def tokens(self, x: torch.Tensor) -> list[int] | None:
        """Each row's greedy token (see the module docstring); None: run the full head."""
        if x.dim() != 2 or x.shape[0] > MAX_ROWS or x.dtype != torch.float32:
            return None
        ids: list[int] = cpu_small_linear.greedy(x.contiguous(), self.packed, self.half,
                                                 self.out_features, self.bound,
                                                 self.max_norm).tolist()
        return None if -1 in ids else ids
