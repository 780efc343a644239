"""Next-token sampling: greedy, temperature, top-k, top-p, per-request seeds.

All random rows are handled together: softmax, top-k and top-p masks and the CDF are batched,
row-wise operations (a row's result never depends on the other rows). Each row then needs a
single uniform number ``u`` and takes the token where its CDF crosses ``u`` (inverse-CDF
sampling). For a seeded request, ``u`` for output token ``i`` is a pure function of
``(seed, i)``, so the same seed gives the same tokens whatever else is in the batch and wherever
the request sits in it. Unseeded requests draw ``u`` from the sampler's own generator.

Before that, ``logits_processors.process_logits`` applies min_tokens, logit_bias and the
penalties (batched, row-wise); min_p filters after temperature. Logprobs, when a row asks for
them, are the log-softmax of the raw logits (vLLM's default): the sampled token's and the
best ``k`` alternatives'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.outputs import TokenLogprob
from engine.core.sampling_params import SamplingParams
from engine.runner.greedy import row_argmax
from engine.runner.logits_processors import History, min_p_filter, process_logits

_MASK64 = (1 << 64) - 1
_TOP_P_PREFIX = 128  # top-p looks at this many best tokens first; full sort only if needed


def seed_for(seed: int, index: int) -> int:
    """A well-mixed 64-bit value for output token ``index`` (splitmix64 finalizer)."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seeded_uniform(seed: int, index: int) -> float:
    """u in [0, 1) from (seed, index) alone: the top 53 bits as a double."""
    return (seed_for(seed, index) >> 11) / float(1 << 53)


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, params: list[SamplingParams], output_indices: list[int],
        histories: list[History | None] | None = None, eos_ids: list[int | None] | None = None,
    ) -> list[int]:
        """logits: [R, V] (one row per sampling request) -> one token id per row."""
        return self.sample_batch(logits, params, output_indices, histories, eos_ids).tokens

    def sample_batch(
        self, logits: torch.Tensor, params: list[SamplingParams], output_indices: list[int],
        histories: list[History | None] | None = None, eos_ids: list[int | None] | None = None,
    ) -> SamplerOutput:
        """``sample`` plus the logprobs of the rows that ask for them. ``histories``: each
        row's (prompt, output) ids (needed by rows with penalties); ``eos_ids``: each row's
        EOS id (banned with its stop ids while short of min_tokens)."""
        n = len(params)
        raw = logits
        logits = process_logits(logits, params, output_indices, histories or [None] * n,
                                eos_ids or [None] * n)
        tokens = row_argmax(logits).tolist()  # the common all-greedy case ends here
        rows = [r for r, p in enumerate(params) if not p.greedy]
        if rows:
            picked = self._sample_rows(
                logits[rows], [params[r] for r in rows], [output_indices[r] for r in rows]
            )
            for r, token in zip(rows, picked, strict=True):
                tokens[r] = token
        return SamplerOutput(tokens, token_logprobs(raw, params, tokens))

    def _sample_rows(
        self, logits: torch.Tensor, params: list[SamplingParams], indices: list[int]
    ) -> list[int]:
        # fp32 math for fp32/bf16 models (fp64 for fp64): the draw is exact up to rounding of
        # a CDF, and every step is per row, so the bits never depend on the rest of the batch
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        temps = torch.tensor([p.temperature for p in params], dtype=dtype)
        probs = torch.softmax(logits.cpu().to(dtype) / temps[:, None], dim=-1)
        probs = min_p_filter(probs, [p.min_p for p in params])
        probs = filter_top_k_top_p(
            probs, [p.top_k for p in params], [p.top_p for p in params]
        )
        unseeded = torch.rand(len(params), generator=self.generator, dtype=torch.float64)
        u = torch.tensor(
            [unseeded[i].item() if p.seed is None else seeded_uniform(p.seed, idx)
             for i, (p, idx) in enumerate(zip(params, indices, strict=True))],
            dtype=dtype,
        )
        cdf = probs.cumsum(dim=-1)
        target = (u * cdf[:, -1]).unsqueeze(1)
        tokens = torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)
        out = tokens.squeeze(1).tolist()
        # u * total can round up to total and land past the last token with mass: rare, fix
        bad = (probs.gather(1, tokens) == 0).squeeze(1).nonzero().flatten().tolist()
        for r in bad:
            out[r] = int(probs[r].nonzero().flatten()[-1])
        return out


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)  # by row


def token_logprobs(logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]
                   ) -> dict[int, TokenLogprob]:
    """For each row asking for logprobs: log-softmax of its raw logits (fp64 for fp64 models,
    else fp32) at the sampled token, and its best ``logprobs`` alternatives."""
    rows = [r for r, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return {}
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    lp = torch.log_softmax(logits[rows].to(dtype), dim=-1).cpu()
    chosen = lp.gather(1, torch.tensor([[tokens[r]] for r in rows])).squeeze(1).tolist()
    k = max(params[r].logprobs or 0 for r in rows)
    top_v, top_i = torch.topk(lp, k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    out = {}
    for i, r in enumerate(rows):
        want = params[r].logprobs or 0
        pairs = zip(top_i[i, :want].tolist(), top_v[i, :want].tolist(), strict=True)
        # a grammar's row has fewer than ``want`` possible tokens: the impossible ones
        # (-inf, masked out) are no alternatives
        out[r] = TokenLogprob(chosen[i], tuple(p for p in pairs if p[1] != float("-inf")))
    return out


def filter_top_k_top_p(
    probs: torch.Tensor, top_k: list[int], top_p: list[float]
) -> torch.Tensor:
    """Zero tokens outside each row's top-k, then (after renormalizing) outside the smallest
    set of best tokens whose mass reaches top_p (the token crossing top_p is kept; ties with
    the last kept token are kept). probs: [R, V] rows summing to 1; top_k 0 / top_p 1 = off."""
    vocab = probs.shape[-1]
    ks = [k if 0 < k < vocab else 0 for k in top_k]
    if any(ks):
        kth = torch.topk(probs, max(ks), dim=-1).values
        idx = torch.tensor([max(k, 1) - 1 for k in ks])
        thresh = kth.gather(1, idx[:, None])
        off = torch.tensor(ks)[:, None] == 0
        thresh[off.squeeze(1)] = 0.0
        probs = torch.where(probs >= thresh, probs, torch.zeros_like(probs))
        # rows without top-k divide by exactly 1.0: their bits never depend on other rows
        probs = probs / torch.where(off, 1.0, probs.sum(dim=-1, keepdim=True))
    if all(p >= 1.0 for p in top_p):
        return probs
    p = torch.tensor(top_p, dtype=probs.dtype)[:, None]
    thresh = _top_p_threshold(probs, p, min(vocab, _TOP_P_PREFIX))
    missing = torch.isnan(thresh).squeeze(1)
    if bool(missing.any()):  # flat rows: the top-p set is longer than the prefix
        thresh[missing] = _top_p_threshold(probs[missing], p[missing], vocab)
    thresh[p >= 1.0] = 0.0
    return torch.where(probs >= thresh, probs, torch.zeros_like(probs))


def _top_p_threshold(probs: torch.Tensor, p: torch.Tensor, k: int) -> torch.Tensor:
    """Per row, the probability of the last token kept by top-p, looking at the best k tokens;
    NaN where those k tokens do not reach p."""
    values = torch.topk(probs, k, dim=-1).values  # sorted descending
    cum = values.cumsum(dim=-1)
    keep = cum - values < p  # the mass strictly above each token is still short of p
    keep[:, 0] = True
    count = keep.sum(dim=-1, keepdim=True)
    thresh = values.gather(1, count - 1)
    reached = cum[:, -1:] >= p
    return torch.where(reached | (count < k), thresh, torch.full_like(thresh, float("nan")))
