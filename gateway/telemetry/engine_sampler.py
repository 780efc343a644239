"""Engine and queue snapshots -> metrics.

The engine reports cumulative counters (preemptions, prefix-cache tokens) and per-step gauges
(batch size, tokens) in the ``EngineStats`` its ``EngineClient.stats()`` returns; the sampler
turns counter deltas into Prometheus counter increments and, unless a ``StepObserver`` sees
every step exactly, observes each new step's batch once. It runs on the event loop from the
worker's per-step callback; the snapshot may be a step or two behind the engine thread, so
such per-step histograms are a sample of steps under load, not every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.core.stats import SchedulerStats
from engine.protocol import EngineClient
from gateway.telemetry.metrics import Metrics


class EngineSampler:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        # The gauges' children, looked up once: a sample runs on every engine step.
        self._running = metrics.engine_requests.labels("running")
        self._waiting = metrics.engine_requests.labels("waiting")
        self._swapped = metrics.engine_requests.labels("swapped")
        self._used = metrics.kv_blocks.labels("used")
        self._free = metrics.kv_blocks.labels("free")
        self._last: SchedulerStats | None = None
        # Off when a StepObserver sees every step exactly (then it owns the step histograms).
        self.observe_steps = True

    def sample(self, stats: SchedulerStats, step_seconds: float | None = None) -> None:
        """Record one snapshot of the scheduler's stats."""
        m = self._metrics
        self._running.set(stats.num_running)
        self._waiting.set(stats.num_waiting)
        self._swapped.set(stats.num_swapped)
        self._used.set(stats.device_blocks_used)
        self._free.set(stats.device_blocks_free)
        last = self._last if self._last is not None else SchedulerStats()
        if stats.num_steps < last.num_steps:  # a new engine (restart): counters start again
            last = SchedulerStats()
        if (self.observe_steps and stats.num_steps > last.num_steps
                and stats.num_scheduled_requests > 0):
            m.batch_size.observe(stats.num_scheduled_requests)
            m.step_tokens.observe(stats.num_scheduled_tokens)
            if step_seconds is not None:
                m.step_seconds.observe(step_seconds)
        _inc(m.preemptions.labels("recompute"), stats.preemptions_recompute,
             last.preemptions_recompute)
        _inc(m.preemptions.labels("swap"), stats.preemptions_swap, last.preemptions_swap)
        _inc(m.prefix_cache_hits, stats.prefix_cache_hits, last.prefix_cache_hits)
        _inc(m.prefix_cache_queries, stats.prefix_cache_queries, last.prefix_cache_queries)
        self._last = stats

    def sample_engine(self, engine: EngineClient) -> None:
        """Record the engine's current snapshot (through its protocol alone)."""
        snapshot = engine.stats()
        self.sample(snapshot.scheduler, snapshot.last_step_seconds)

    def sample_queues(self, depths: Mapping[str, int]) -> None:
        for tier, depth in depths.items():
            self._metrics.queue_depth.labels(tier).set(depth)


def _inc(counter: Any, now: int, before: int) -> None:
    if now > before:
        counter.inc(now - before)
