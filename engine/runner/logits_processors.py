"""Logits processors applied before sampling, batched over the rows that need them.

``process_logits`` applies, in vLLM's order: ``min_tokens`` (EOS and stop ids to -inf while a
request is short of its minimum), ``logit_bias``, then the penalties (repetition over prompt +
output, frequency and presence over the output). Each is one tensor operation over the batch:
Python loops run over requests only to build index lists (scatter coordinates), never over
the vocabulary. Rows that need none of this keep their logits bit for bit, and every operation
is row-wise, so a row's result never depends on the other rows of the batch (seeded sampling
stays reproducible across batch compositions).

``min_p_filter`` works on probabilities (after temperature) and lives here for the same reason.
"""

from __future__ import annotations

import torch

from engine.core.sampling_params import SamplingParams

History = tuple[list[int], list[int]]  # (prompt ids, output ids so far)


def process_logits(
    logits: torch.Tensor,
    params: list[SamplingParams],
    output_indices: list[int],
    histories: list[History | None],
    eos_ids: list[int | None],
) -> torch.Tensor:
    """logits [R, V] (float) -> logits with every row's processors applied (a new tensor when
    any row needs one, else ``logits`` itself)."""
    rows = [r for r, p in enumerate(params) if p.processes_logits]
    if not rows:
        return logits
    # fp32 (fp64 for fp64 models): a bf16 penalty would round; the sampler computes in fp32
    # anyway, so the untouched rows' values are the same numbers
    logits = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
    sub = logits[rows].clone()
    sub_params = [params[r] for r in rows]
    _ban_stops(sub, sub_params, [output_indices[r] for r in rows], [eos_ids[r] for r in rows])
    _add_bias(sub, sub_params)
    pen = [i for i, p in enumerate(sub_params) if p.needs_history]
    if pen:
        hist = [histories[rows[i]] for i in pen]
        if any(h is None for h in hist):
            raise ValueError("penalties need the request's token history")
        sub[pen] = apply_penalties(sub[pen], [sub_params[i] for i in pen],
                                   [h for h in hist if h is not None])
    out = logits.clone()
    out[rows] = sub
    return out


def _ban_stops(sub: torch.Tensor, params: list[SamplingParams], produced: list[int],
               eos_ids: list[int | None]) -> None:
    rows: list[int] = []
    toks: list[int] = []
    vocab = sub.shape[-1]
    for i, (p, n, eos) in enumerate(zip(params, produced, eos_ids, strict=True)):
        if n >= p.min_tokens:
            continue
        stops = set(p.stop_token_ids)
        if eos is not None and not p.ignore_eos:
            stops.add(eos)
        stops = {t for t in stops if 0 <= t < vocab}
        rows.extend([i] * len(stops))
        toks.extend(stops)
    if rows:
        sub[torch.tensor(rows), torch.tensor(toks)] = float("-inf")


def _add_bias(sub: torch.Tensor, params: list[SamplingParams]) -> None:
    rows: list[int] = []
    toks: list[int] = []
    bias: list[float] = []
    vocab = sub.shape[-1]
    for i, p in enumerate(params):
        for t, b in p.logit_bias:
            if t >= vocab:  # the gateway refuses these; offline callers' are ignored
                continue
            rows.append(i)
            toks.append(t)
            bias.append(b)
    if rows:
        values = torch.tensor(bias, dtype=sub.dtype, device=sub.device)
        sub.index_put_((torch.tensor(rows), torch.tensor(toks)), values, accumulate=True)


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams],
                    histories: list[History]) -> torch.Tensor:
    """vLLM's ``apply_penalties``: repetition over prompt + output tokens, then
    ``- frequency * count - presence * (count > 0)`` over output tokens. logits [R, V]."""
    rows_n, vocab = logits.shape
    dev, dtype = logits.device, logits.dtype
    out_rows, out_ids, seen_rows, seen_ids = [], [], [], []
    for r, (prompt, output) in enumerate(histories):
        out_rows.extend([r] * len(output))
        out_ids.extend(output)
        seen_rows.extend([r] * len(prompt))
        seen_ids.extend(prompt)
    counts = torch.zeros(rows_n, vocab, dtype=dtype, device=dev)
    if out_ids:
        counts.index_put_((torch.tensor(out_rows), torch.tensor(out_ids)),
                          torch.ones(len(out_ids), dtype=dtype, device=dev), accumulate=True)
    seen = counts > 0
    if seen_ids:
        seen[torch.tensor(seen_rows), torch.tensor(seen_ids)] = True
    rep = torch.tensor([p.repetition_penalty for p in params], dtype=dtype, device=dev)[:, None]
    rep = torch.where(seen, rep, torch.ones_like(rep))
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=dtype, device=dev)[:, None]
    pres = torch.tensor([p.presence_penalty for p in params], dtype=dtype, device=dev)[:, None]
    return logits - freq * counts - pres * (counts > 0).to(dtype)


def min_p_filter(probs: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Zero each row's tokens below ``min_p`` times its best probability (0 = off; rows with
    0 keep their exact values)."""
    if not any(m > 0 for m in min_p):
        return probs
    m = torch.tensor(min_p, dtype=probs.dtype, device=probs.device)[:, None]
    thresh = probs.max(dim=-1, keepdim=True).values * m
    return torch.where(probs >= thresh, probs, torch.zeros_like(probs))
