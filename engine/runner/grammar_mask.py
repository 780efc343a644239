"""The grammar mask: constrained rows' logits outside what their grammar allows become -inf.

Only the constrained rows are touched (a batch without any pays one ``any`` over its params);
each such row costs one mask from its matcher (a 49,152-token vocabulary is 1,536 int32
words, filled by the backend) and one masked fill of its logits row. The mask is applied
before the sampler, so the processors, temperature, top-k/top-p and logprobs all see the
constrained distribution (vLLM does the same).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.core.outputs import ScheduledRequest
from engine.structured.rows import GrammarRows


def constrained_rows(rows: list[ScheduledRequest]) -> list[int]:
    return [i for i, s in enumerate(rows) if s.sampling_params.structured is not None]


def apply_grammar_mask(logits: torch.Tensor, rows: list[ScheduledRequest], which: list[int],
                       grammars: GrammarRows) -> torch.Tensor:
    """``logits`` [R, V] with rows ``which`` masked by their grammars (in place when the
    logits may be written, which ``compute_logits``' output always may)."""
    vocab = logits.shape[-1]
    # the tokenizer's vocabulary may be smaller than the model's (padded) one, or larger
    words = (max(vocab, grammars.compiler.vocab_size) + 31) // 32
    bitmask = torch.zeros((len(which), words), dtype=torch.int32)
    for k, r in enumerate(which):
        state = grammars.state_for(rows[r])
        row = bitmask[k]
        if state.broken:
            eos = rows[r].eos_token_id
            if eos is not None and eos < vocab:
                row[eos // 32] = _bit(eos % 32)
            continue
        state.matcher.unsafe_compute_mask_ptr(row.data_ptr(), words * 4)
    # one bit per token, little-endian words: numpy unpacks them in token order, in C (the
    # same with torch's shifts over [rows, words, 32] cost ~100x as much on a 2-core CPU)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    banned = bits[:, :vocab] == 0
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        # numpy's in-place fill: torch's masked_fill_ on one 49k row took ~4 ms on this
        # 2-core CPU under load (its intra-op threads), numpy's ~0.05 ms
        rows_np = logits.numpy()
        for k, r in enumerate(which):
            rows_np[r][banned[k]] = -np.inf
        return logits
    mask = torch.from_numpy(banned).to(logits.device)
    for k, r in enumerate(which):
        logits[r].masked_fill_(mask[k], float("-inf"))
    return logits


def _bit(i: int) -> int:
    # bit 31 set is a negative int32
    return (1 << i) if i < 31 else -(1 << 31)
