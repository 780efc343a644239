"""The grammar mask: constrained rows' logits outside what their grammar allows become -inf.

Only the constrained rows are touched (a batch without any pays one ``any`` over its params);
each such row costs one mask from its matcher (a 49,152-token vocabulary is 1,536 int32
words, filled by the backend) and one masked fill of its logits row. The mask is applied
before the sampler, so the processors, temperature, top-k/top-p and logprobs all see the
constrained distribution (vLLM does the same).
"""

from __future__ import annotations

import torch

from engine.core.outputs import ScheduledRequest
from engine.structured.rows import GrammarRows

_BITS = torch.arange(32, dtype=torch.int32)


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
    # the matchers fill CPU memory; on an accelerator the (small) bitmask moves, not logits
    bitmask = bitmask.to(logits.device)
    allowed = ((bitmask.unsqueeze(-1) >> _BITS.to(logits.device)) & 1).view(
        len(which), words * 32)[:, :vocab]
    index = torch.tensor(which, device=logits.device)
    logits[index] = logits[index].masked_fill(allowed == 0, float("-inf"))
    return logits


def _bit(i: int) -> int:
    # bit 31 set is a negative int32
    return (1 << i) if i < 31 else -(1 << 31)
