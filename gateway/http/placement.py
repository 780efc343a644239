"""Prefix-aware placement at the edge: the worker a new request should go to first.

``policies.placement`` ranks the live workers that take new work (as the shedder last read
them from the tier status) by rendezvous hashing of the prompt's leading KV blocks; the first
of them within the load bound over this gateway's latest placements (``window_size``) gets
it (``bounded_choice``: a hot prefix spills to the next worker in its order). The queue entry
carries it (``QueueEntries.admit(prefer=...)``); the workers hold it for that worker
``placement_wait_ms`` before any may take it (the fair pick, ``bus/scripts.py``). See
docs/fleet.md."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from engine.core.config import CacheConfig
from gateway.config import GatewayConfig
from policies.placement import bounded_choice, prefix_key, rank, window_size


class Placement:
    def __init__(self, config: GatewayConfig) -> None:
        self.on = config.placement_wait_ms > 0
        self.block_size = int(config.engine_options.get("block_size")
                              or CacheConfig().block_size)
        self.max_blocks = config.placement_blocks
        self.factor = config.placement_load_factor
        self._recent: deque[str] = deque()
        self._counts: Counter[str] = Counter()

    def prefer(self, workers: Sequence[str], tokens: Sequence[int]) -> str:
        """The preferred worker's id for a prompt, or '' (placement off, no live worker, no
        full block); counted in the window."""
        if not self.on or not workers:
            return ""
        key = prefix_key(tokens, self.block_size, self.max_blocks)
        if key is None:
            return ""
        window = window_size(len(workers))
        chosen = bounded_choice(rank(key, workers), self._counts, self.factor, window) or ""
        while len(self._recent) >= window:  # (the window shrinks when workers leave)
            self._counts[self._recent.popleft()] -= 1
        self._recent.append(chosen)
        self._counts[chosen] += 1
        return chosen
