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
gamma_K = K u / (1 - K u), u = 2^-24). ``bound`` is the largest such coefficient over j (with
a margin), C, so every fp32 maximizer has a screened logit within 2 C ||x||_2 of the screened
maximum: those are the candidates, and the first maximum among their fp32 logits is the
row's token. A non-finite input or logit returns -1 for the row and the caller runs the full
head.

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


def half_pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] fp32 -> fp16 [ceil(N/32), K, 32], laid out (and paged) as ``cpu_small_linear.pack``
    lays fp32."""
    packed: torch.Tensor = cpu_small_linear.pack_as(weight.detach().contiguous(), True)
    return packed


def screen_bound(weight: torch.Tensor) -> float:
    """C: |fp32 logit - fp16-screened logit| <= C ||x||_2 for every output (module docstring)."""
    w = weight.detach().to(torch.float64)
    h = weight.detach().to(torch.float16).to(torch.float64)
    k = w.shape[1]
    gamma = k * _U / (1 - k * _U)
    per_row = (w - h).norm(dim=1) + gamma * (w.norm(dim=1) + h.norm(dim=1))
    return float(per_row.max()) * _MARGIN


@dataclass(frozen=True)
class ScreenedHead:
    packed: torch.Tensor  # the small-batch op's fp32 [tiles, K, 32]
    half: torch.Tensor  # fp16, same layout
    out_features: int
    bound: float

    @classmethod
    def of(cls, weight: torch.Tensor, packed: torch.Tensor | None) -> ScreenedHead | None:
        if (packed is None or not cpu_small_linear.available() or weight.dtype != torch.float32
                or not cpu_small_linear.has_half()):
            return None
        if not bool(weight.detach().abs().max() <= _FP16_MAX):  # also False for a NaN
            return None
        return cls(packed, half_pack(weight), weight.shape[0], screen_bound(weight))

    def tokens(self, x: torch.Tensor) -> list[int] | None:
        """Each row's greedy token (see the module docstring); None: run the full head."""
        if x.dim() != 2 or x.shape[0] > MAX_ROWS or x.dtype != torch.float32:
            return None
        ids: list[int] = cpu_small_linear.greedy(x.contiguous(), self.packed, self.half,
                                                 self.out_features, self.bound).tolist()
        return None if -1 in ids else ids
