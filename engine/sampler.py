"""Next-token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Random rows use the exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` i.i.d. is an exact
draw from ``p``. For a seeded request the noise of output token ``i`` comes from a generator
seeded by ``(seed, i)`` alone, so the same seed gives the same tokens whatever else is in the
batch and wherever the request sits in it. Unseeded requests share the sampler's generator.
Every operation is per row, so a row's result never depends on the other rows.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1


def seed_for(seed: int, index: int) -> int:
    """A well-mixed 63-bit generator seed for output token ``index`` (splitmix64 finalizer)."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, params: list[SamplingParams], output_indices: list[int]
    ) -> list[int]:
        """logits: [R, V] (one row per sampling request) -> one token id per row."""
        if all(p.greedy for p in params):  # the common case: one vectorized argmax
            return logits.argmax(dim=-1).tolist()
        greedy = logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for row, (p, index) in enumerate(zip(params, output_indices, strict=True)):
            out.append(greedy[row] if p.greedy else self._sample_row(logits[row], p, index))
        return out

    def _sample_row(self, logits: torch.Tensor, p: SamplingParams, index: int) -> int:
        work_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        probs = torch.softmax(logits.to(work_dtype) / p.temperature, dim=-1)
        probs = filter_top_k_top_p(probs, p.top_k, p.top_p)
        if p.seed is not None:
            gen = torch.Generator().manual_seed(seed_for(p.seed, index))
        else:
            gen = self.generator
        noise = torch.empty(probs.shape[-1], dtype=work_dtype).exponential_(generator=gen)
        return int((probs.cpu() / noise).argmax())


def filter_top_k_top_p(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero out tokens outside the top-k and outside the smallest set whose mass reaches
    top_p (the token that crosses top_p is kept). probs: [V], sums to 1. Not renormalized:
    the exponential race only needs relative weights."""
    vocab = probs.shape[-1]
    if top_k <= 0 or top_k >= vocab:
        top_k = 0
    if top_k == 0 and top_p >= 1.0:
        return probs
    if top_p >= 1.0:
        kth = torch.topk(probs, top_k).values[-1]
        return torch.where(probs >= kth, probs, torch.zeros_like(probs))
    k = top_k if top_k else vocab
    values, indices = torch.topk(probs, k)  # sorted descending
    values = values / values.sum()  # top_p applies after top_k (as in HF and vLLM)
    before = values.cumsum(0) - values  # mass strictly above each token
    keep = before < top_p
    keep[0] = True
    out = torch.zeros_like(probs)
    out[indices[keep]] = values[keep]
    return out
