"""Scheduler statistics: a frozen snapshot per read (``Scheduler.stats``), and the engine's
snapshot (``EngineClient.stats()``) that telemetry reads instead of walking into the engine.
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerStats:
    """Gauges describe the state after the last ``schedule()``; counters are cumulative."""

    # gauges
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_scheduled_tokens: int = 0  # tokens in the last step's batch
    num_scheduled_requests: int = 0
    lowest_running_priority: int | None = None  # largest priority number running; None if idle
    urgent_row_cap: int | None = None  # Scheduler.set_urgent_row_cap's cap; None: no cap
    # (priority, count) ascending: who is queued, so admission counts only the more urgent
    waiting_by_priority: tuple[tuple[int, int], ...] = ()
    swapped_by_priority: tuple[tuple[int, int], ...] = ()
    device_blocks_total: int = 0
    device_blocks_used: int = 0
    device_blocks_free: int = 0
    cpu_blocks_total: int = 0
    cpu_blocks_used: int = 0
    # counters
    num_steps: int = 0
    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    aborts: int = 0
    errors: int = 0
    finished: int = 0  # every finish, aborts and errors included
    rows_held_back: int = 0  # running rows skipped by the urgent row cap, summed over steps
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which served from cached blocks

    @property
    def num_free_blocks(self) -> int:
        return self.device_blocks_free

    @property
    def num_total_blocks(self) -> int:
        return self.device_blocks_total

    @property
    def kv_usage(self) -> float:
        return self.device_blocks_used / self.device_blocks_total if self.device_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def preemptions(self) -> int:
        return self.preemptions_recompute + self.preemptions_swap


@dataclass(frozen=True)
class EngineStats:
    """What ``EngineClient.stats()`` returns: the scheduler's last snapshot and how long the
    last step took (None before the first step). Safe to read from any thread."""

    scheduler: SchedulerStats = SchedulerStats()
    last_step_seconds: float | None = None
    # steps that have ended (``scheduler.num_steps`` counts the one in flight too): a request
    # read now gets its first token ``first_token_step - steps_done`` steps later
    steps_done: int = 0


@dataclass
class SchedulerCounters:
    """The scheduler's own mutable tallies; copied into each SchedulerStats snapshot."""

    num_scheduled_tokens: int = 0
    num_scheduled_requests: int = 0
    num_steps: int = 0
    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    aborts: int = 0
    errors: int = 0
    finished: int = 0
    rows_held_back: int = 0
