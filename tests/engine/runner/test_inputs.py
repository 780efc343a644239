"""build_inputs against a per-token reference: ids, positions, slots (chunks crossing block
edges, scattered block ids), padded tables, lengths, query starts, logits rows, padding rows."""

from __future__ import annotations

import random

import torch

from engine.core.outputs import ScheduledRequest
from engine.core.sampling_params import SamplingParams
from engine.runner.inputs import build_inputs, token_slots

BS = 4


def _request(rng: random.Random, rid: str, start: int, n: int, sample: bool) -> ScheduledRequest:
    blocks = rng.sample(range(100), -(-(start + n) // BS) + rng.randint(0, 2))
    ids = [rng.randrange(1000) for _ in range(n)]
    return ScheduledRequest(rid, ids, start, blocks, sample, SamplingParams(), 0)


def _reference(rows: list[ScheduledRequest], n_real: int) -> dict[str, list]:
    """Token by token, straight from the definitions."""
    out: dict[str, list] = {k: [] for k in ("ids", "pos", "slots", "lens", "qsl", "logits")}
    out["qsl"].append(0)
    for s in rows:
        for i, tok in enumerate(s.token_ids):
            p = s.start_pos + i
            out["ids"].append(tok)
            out["pos"].append(p)
            out["slots"].append(s.block_ids[p // BS] * BS + p % BS)
        out["lens"].append(s.start_pos + len(s.token_ids))
        out["qsl"].append(out["qsl"][-1] + len(s.token_ids))
        if s.sample:
            out["logits"].append(out["qsl"][-1] - 1)
    width = max(len(s.block_ids) for s in rows)
    out["tables"] = [s.block_ids + [0] * (width - len(s.block_ids)) for s in rows]
    out["sample"] = [s.request_id for s in rows[:n_real] if s.sample]
    return out


def test_mixed_steps_equal_the_reference() -> None:
    rng = random.Random(0)
    for trial in range(200):
        rows = [_request(rng, f"r{i}", rng.randint(0, 13), rng.choice([1, 1, 2, 5, 9]),
                         rng.random() < 0.8) for i in range(rng.randint(1, 6))]
        pad = [_request(rng, "", rng.randint(0, 9), 1, True)] * rng.choice([0, 0, 2])
        got = build_inputs(rows, BS, torch.device("cpu"), pad or None)
        want = _reference(rows + pad, len(rows))
        assert got.input_ids.tolist() == want["ids"], trial
        assert got.positions.tolist() == want["pos"], trial
        assert got.meta.slot_mapping.tolist() == want["slots"], trial
        assert got.meta.seq_lens.tolist() == want["lens"], trial
        assert got.meta.query_start_loc.tolist() == want["qsl"], trial
        assert got.meta.block_tables.tolist() == want["tables"], trial
        assert got.logits_indices.tolist() == want["logits"], trial
        assert [s.request_id for s in got.sample_rows] == want["sample"], trial
        assert got.samples_every_token == (want["logits"] == list(range(len(want["ids"]))))
        assert got.meta.slot_mapping.dtype == got.input_ids.dtype == torch.int64
        assert got.meta.block_tables.dtype == got.meta.seq_lens.dtype == torch.int32


def test_token_slots_cross_block_edges() -> None:
    blocks = [7, 2, 9, 4]
    for start in range(12):
        for end in range(start, 16):
            assert token_slots(blocks, start, end, BS) == [
                blocks[p // BS] * BS + p % BS for p in range(start, end)]
