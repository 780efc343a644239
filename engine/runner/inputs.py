"""One step's model inputs: the scheduled requests flattened into index tensors.

Contract: ``build_inputs(scheduled, block_size, device, pad)`` returns ``StepInputs``: every
scheduled token's id and position (requests in order), its KV-cache slot
(``block_ids[pos // block_size] * block_size + pos % block_size``), the block tables padded
with 0 to the longest, each row's context length (start + new tokens) and query start, the
rows whose last token is sampled (``logits_indices``) and their requests. ``pad`` (dummy
decode rows of a fixed-shape batch) go last and are never in ``sample_rows``.

Why plain Python lists first: a decode step has one token a row, and building the slots with
tensor ops (``repeat_interleave``, an index, a multiply, a floor division and a remainder, each
a dispatch and an allocation) cost more than the arithmetic itself; each list becomes one
``torch.tensor`` call. A long prompt chunk's slots are computed per block, not per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.outputs import ScheduledRequest
from engine.models.llama_layers import AttentionMetadata


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sample_rows: list[ScheduledRequest]

    @property
    def samples_every_token(self) -> bool:
        """Every token is a sampling row's last (a pure decode step): the logits rows are the
        hidden rows in order, so no gather is needed."""
        return self.logits_indices.numel() == self.input_ids.numel()


def build_inputs(scheduled: list[ScheduledRequest], block_size: int, device: torch.device,
                 pad: list[ScheduledRequest] | None = None) -> StepInputs:
    """Flatten ``scheduled`` (then ``pad``) into a step's tensors (see the module docstring)."""
    rows = [*scheduled, *pad] if pad else scheduled
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    logits_rows: list[int] = []
    for s in rows:
        start, end = s.start_pos, s.start_pos + len(s.token_ids)
        ids += s.token_ids
        if end - start == 1:  # a decode row
            positions.append(start)
            slots.append(s.block_ids[start // block_size] * block_size + start % block_size)
        else:
            positions += range(start, end)
            slots += token_slots(s.block_ids, start, end, block_size)
        seq_lens.append(end)
        qsl.append(qsl[-1] + end - start)
        tables.append(s.block_ids)
        if s.sample:
            logits_rows.append(qsl[-1] - 1)
    width = max(len(t) for t in tables)
    padded = [t if len(t) == width else t + [0] * (width - len(t)) for t in tables]

    def i64(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    def i32(values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    meta = AttentionMetadata(slot_mapping=i64(slots), block_tables=i32(padded),
                             seq_lens=i32(seq_lens), query_start_loc=i32(qsl))
    n_real = len(scheduled)
    return StepInputs(input_ids=i64(ids), positions=i64(positions), meta=meta,
                      logits_indices=i64(logits_rows),
                      sample_rows=[s for s in rows[:n_real] if s.sample])


def token_slots(block_ids: list[int], start: int, end: int, block_size: int) -> list[int]:
    """The cache slots of positions ``start .. end - 1``: one ``range`` per block touched."""
    out: list[int] = []
    pos = start
    while pos < end:
        block, offset = divmod(pos, block_size)
        run = min(block_size - offset, end - pos)
        base = block_ids[block] * block_size + offset
        out += range(base, base + run)
        pos += run
    return out
