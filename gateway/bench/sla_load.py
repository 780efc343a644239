"""Load for ``carpool bench sla``: distinct chat prompts, open-loop streams, a closed-loop
capacity calibration, and the drain after each row.

A row offers its streams for ``duration`` seconds (open loop: arrivals at a fixed rate,
whatever the answers). Then offering stops; the *probe* streams' calls (the ones whose
latency the row reports) get ``grace`` seconds to finish while the backlog is still there;
every call still open is then cut short (its connection closed: the gateway cancels it), so
one row's backlog never leaks into the next. Output tokens are counted in the offering window
only, each call's tokens spread evenly between its first and last content event.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.bench.sla_client import Call, ChatTarget

TOPICS = ("lighthouses", "glaciers", "bread baking", "chess openings", "tide pools", "comets",
          "bees", "old maps", "volcanoes", "trains", "coral reefs", "paper making",
          "owls", "rivers", "clocks", "deserts")


class Prompts:
    """Chat bodies, no two alike from their first token on (the prefix cache shares none),
    asking for more text than ``max_tokens`` allows so most answers run to the limit."""

    def __init__(self, seed: int = 0, min_tokens: int = 32, max_tokens: int = 64) -> None:
        self._rng = random.Random(seed)
        self._n = 0
        self.min_tokens, self.max_tokens = min_tokens, max_tokens

    def body(self) -> dict[str, object]:
        self._n += 1
        topic = self._rng.choice(TOPICS)
        return {"max_tokens": self._rng.randint(self.min_tokens, self.max_tokens),
                "messages": [
                    {"role": "system", "content": f"{self._n} {self._rng.random():.6f}: you "
                                                  "are a writer. Answer at length."},
                    {"role": "user", "content": f"Write a long story about {topic}."}]}


@dataclass(frozen=True)
class Stream:
    """One tenant's offered load in a row. ``name`` labels its calls in the bench."""

    name: str
    key: str
    tier: str
    rate: float  # requests per second, open loop
    probe: bool = False


@dataclass
class RowRun:
    calls: list[Call]
    start: float
    end: float  # end of the offering window

    def of(self, *names: str) -> list[Call]:
        return [c for c in self.calls if c.tenant in names]

    def window_tokens(self, *names: str) -> float:
        return sum(tokens_in(c, self.start, self.end) for c in self.of(*names))


def tokens_in(call: Call, start: float, end: float) -> float:
    """``call``'s output tokens received in [start, end], spread over its first..last event."""
    if call.first is None or call.last is None:
        return 0.0
    n = call.output_tokens
    if call.last <= call.first:
        return float(n) if start <= call.first <= end else 0.0
    overlap = min(end, call.last) - max(start, call.first)
    return n * max(0.0, overlap) / (call.last - call.first)


async def run_row(target: ChatTarget, prompts: Prompts, streams: Sequence[Stream],
                  duration: float, grace: float) -> RowRun:
    tasks: list[asyncio.Task[Call]] = []
    probes: list[asyncio.Task[Call]] = []
    first = len(target.calls)
    start = time.perf_counter()

    async def offer(s: Stream) -> None:
        if s.rate <= 0:
            return
        gap = 1.0 / s.rate
        t = start + random.Random(s.name).random() * gap  # streams out of phase
        while t < start + duration:
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            task = asyncio.create_task(target.chat(s.key, s.name, s.tier, prompts.body()))
            (probes if s.probe else tasks).append(task)
            t += gap

    await asyncio.gather(*(offer(s) for s in streams))
    end = start + duration
    if probes:
        await asyncio.wait(probes, timeout=grace)
    await _cut(tasks + probes)
    return RowRun(target.calls[first:], start, end)


async def calibrate(target: ChatTarget, prompts: Prompts, key: str, tier: str,
                    concurrency: int, duration: float) -> float:
    """Closed loop of ``concurrency`` streams for ``duration`` s: output tokens/s over the
    last two thirds (the first ramps up)."""
    start = time.perf_counter()
    stop = start + duration

    async def lane() -> None:
        while time.perf_counter() < stop:
            await target.chat(key, "calibration", tier, prompts.body())

    first = len(target.calls)
    lanes = [asyncio.create_task(lane()) for _ in range(concurrency)]
    await asyncio.sleep(duration)
    await _cut(lanes)
    w0 = start + duration / 3
    return sum(tokens_in(c, w0, stop) for c in target.calls[first:]) / (stop - w0)


def tokens_per_request(calls: Sequence[Call], prompts: Prompts) -> tuple[float, int]:
    """(Mean output tokens a request yields, finished calls it is estimated from). The calls
    that finish in a short window are the short ones, so it is the asked mean times the mean
    fraction of its ``max_tokens`` a finished call got (an answer may end early at EOS);
    with none finished, the asked mean."""
    asked = (prompts.min_tokens + prompts.max_tokens) / 2
    got = [c.output_tokens / c.max_tokens for c in calls if c.done and c.max_tokens]
    return asked * (sum(got) / len(got) if got else 1.0), len(got)


async def _cut(tasks: list[asyncio.Task[Call]] | list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
