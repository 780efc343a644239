"""Whether the worker should pull another request into the engine now. Pure functions."""

from __future__ import annotations

from engine.protocol import EngineLoad

# Keep a few percent of blocks in reserve so running requests can keep decoding.
MIN_FREE_BLOCK_FRACTION = 0.05
# A short queue inside the engine lets the next step admit at once; a long one would move the
# tier decision from the drainer's WRR into the engine's priority order.
MAX_ENGINE_WAITING = 4


def engine_has_capacity(load: EngineLoad, priority: int) -> bool:
    """Room for one more request of ``priority``: a free seat with blocks to spare and
    only a short queue inside the engine, or lower-priority running work it may preempt."""
    seats = load.max_num_seqs - load.num_running - load.num_swapped
    free_fraction = load.num_free_blocks / max(1, load.num_total_blocks)
    if load.num_waiting >= MAX_ENGINE_WAITING:
        return False
    if seats > load.num_waiting and free_fraction > MIN_FREE_BLOCK_FRACTION:
        return True
    lowest = load.lowest_running_priority
    return lowest is not None and lowest > priority
