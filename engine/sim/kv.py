"""Seed 004 section 6: the KV cache, not a knob, bounds concurrency.

    KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes
    blocks             = floor(memory / (bytes per token x block_size))
    blocks per request = ceil(average sequence length / block_size)
    concurrency        = floor(blocks / blocks per request)

The average sequence length is prompt + output: a request holds its KV until it finishes,
and the scheduler preempts when a growing batch runs out of blocks, so planning on the
final length keeps the planned batch free of memory preemptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.sim.profile import ModelShape

GB = 1 << 30


@dataclass(frozen=True)
class KvCapacity:
    bytes_per_token: int
    block_size: int
    num_blocks: int
    avg_seq_len: float
    blocks_per_request: int
    concurrency: int

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size


def kv_capacity(memory_gb: float, shape: ModelShape, block_size: int,
                avg_seq_len: float) -> KvCapacity:
    if not (memory_gb > 0 and math.isfinite(memory_gb)):
        raise ValueError(f"KV cache memory must be a positive number of GB, got {memory_gb!r}")
    if block_size < 1 or not avg_seq_len >= 1:
        raise ValueError("need block_size >= 1 and an average sequence length >= 1 token")
    per_token = shape.kv_bytes_per_token
    blocks = int(memory_gb * GB // (per_token * block_size))
    per_request = math.ceil(avg_seq_len / block_size)
    return KvCapacity(per_token, block_size, blocks, avg_seq_len, per_request,
                      blocks // per_request)
