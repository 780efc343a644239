"""The drainer's pulls against a recording stand-in for the tier queues: when it counts
backlogs (to batch and weigh tiers) and when it waits on the tiers' wake lists straight
away (then picks from every tier it waited on)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.bus.messages import SubmitMsg
from gateway.bus.queues import Envelope
from gateway.worker.drainer import CLOSED_BLOCK_S, IDLE_BLOCK_S, RECOUNT_S, Drainer
from policies.admission import EngineLoad
from policies.tiers import DEFAULT_TIER_WEIGHTS, TIERS


class RecordingQueues:
    """Answers each wait and the pick after it with the next scripted batch (an empty batch:
    the wait timed out); records every call."""

    tiers = TIERS
    held_s: float | None = None  # no placement: no pick passes over an entry

    def __init__(self, reads: list[list[str]]) -> None:
        self.reads = list(reads)  # per wait: the tiers of the entries the pick then returns
        self.calls: list[str] = []
        self.timeouts: list[float] = []

    async def backlogs(self) -> dict[str, int]:
        self.calls.append("backlogs")
        return {t: 0 for t in TIERS}

    async def wait(self, tiers: Any, timeout_s: float, consumer: str | None = None) -> str | None:
        self.calls.append("wait")
        self.timeouts.append(timeout_s)
        await asyncio.sleep(0)  # a real wait yields to the loop
        if self.reads and not self.reads[0]:
            self.reads.pop(0)
        return self.reads[0][0] if self.reads else None

    async def read_counts(self, counts: dict[str, int], consumer: str, skip: Any = None
                          ) -> dict[str, list[Envelope]]:
        assert len(set(counts.values())) == 1  # the same count from every tier waited on
        self.calls.append(f"read count={next(iter(counts.values()))}")
        got = self.reads.pop(0) if self.reads else []
        out: dict[str, list[Envelope]] = {t: [] for t in counts}
        for i, t in enumerate(got):
            out[t].append(Envelope(t, f"{i}-0", SubmitMsg(f"r{i}", "t", t, 0, [1], 1)))
        return out


class IdleEngine:
    def has_capacity(self, priority: int) -> bool:
        return True

    def load(self) -> EngineLoad:
        return EngineLoad(0, 0, 0, 100, 100, 16, None)


def make_drainer(reads: list[list[str]]) -> tuple[Drainer, RecordingQueues, list[int]]:
    queues = RecordingQueues(reads)
    started: list[int] = []

    async def start(envs: list[Envelope]) -> None:
        started.append(len(envs))

    drainer = Drainer(queues, IdleEngine(), "w1", DEFAULT_TIER_WEIGHTS, start)  # type: ignore[arg-type]
    return drainer, queues, started


async def test_a_lone_arrival_keeps_the_drainer_waiting_without_counting_backlogs() -> None:
    drainer, queues, started = make_drainer([["interactive"], ["batch"], []])
    for _ in range(3):
        await drainer._step()
    assert queues.calls == ["backlogs", "wait", "read count=1", "wait", "read count=2", "wait"]
    assert started == [1, 1]
    # a wait that timed out right after a count: the drainer waits again (an idle worker
    # does not read every shard each IDLE_BLOCK_S)
    assert drainer.quiet
    await drainer._step()
    assert queues.calls[-1:] == ["wait"] and queues.calls.count("backlogs") == 1
    # one that timed out RECOUNT_S after the last count: the next pull counts the backlogs
    # (a wake token may be lost)
    drainer.counted_at -= RECOUNT_S
    await drainer._step()
    assert not drainer.quiet
    await drainer._step()
    assert queues.calls[-2:] == ["backlogs", "wait"]


async def test_a_burst_or_several_tiers_go_back_to_counting_backlogs() -> None:
    drainer, queues, started = make_drainer([["interactive"], ["batch", "batch"]])
    for _ in range(3):
        await drainer._step()
    assert queues.calls == ["backlogs", "wait", "read count=1", "wait", "read count=2",
                            "backlogs", "wait"]
    assert started == [1, 2]


async def test_a_restarted_drainer_counts_backlogs_first() -> None:
    drainer, queues, _ = make_drainer([["interactive"]])
    await drainer._step()
    assert drainer.quiet  # a backlog may build while the drainer is stopped (held)
    task = asyncio.create_task(drainer.run())
    while len(queues.calls) < 4:
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert queues.calls[:4] == ["backlogs", "wait", "read count=1", "backlogs"]


async def test_a_full_engine_ends_quiet_mode_like_a_hold() -> None:
    drainer, queues, _ = make_drainer([["interactive"]])
    await drainer._step()
    assert drainer.quiet
    room = {"open": False}  # a backlog may build while the engine has no room
    drainer.engine.has_capacity = lambda priority: room["open"]  # type: ignore[method-assign]
    await drainer._step()
    room["open"] = True
    await drainer._step()
    assert queues.calls == ["backlogs", "wait", "read count=1", "backlogs", "wait"]


async def test_the_wait_is_short_while_a_tier_is_closed_for_room() -> None:
    """A step's end opens a closed tier and wakes nobody: the wait on the open ones must
    not outlast it (a request of the closed tier would miss a step)."""
    drainer, queues, _ = make_drainer([])
    await drainer._step()  # every tier open: the long idle wait
    drainer.engine.has_capacity = lambda priority: priority == 0  # type: ignore[method-assign]
    await drainer._step()  # the lower tiers closed: the short one
    assert queues.timeouts == [IDLE_BLOCK_S, CLOSED_BLOCK_S]
    assert CLOSED_BLOCK_S < IDLE_BLOCK_S


class HoldingQueues(RecordingQueues):
    """A backlog whose every entry is held for another worker (placement): the picks return
    nothing and say the soonest is stealable in 20 ms."""

    async def backlogs(self) -> dict[str, int]:
        self.calls.append("backlogs")
        return {t: 1 if t == "interactive" else 0 for t in TIERS}

    async def read_counts(self, counts: dict[str, int], consumer: str, skip: Any = None
                          ) -> dict[str, list[Envelope]]:
        self.calls.append("read")
        self.held_s = 0.02
        return {t: [] for t in counts}


async def test_entries_held_for_another_worker_are_waited_for_until_stealable() -> None:
    queues = HoldingQueues([])
    drainer = Drainer(queues, IdleEngine(), "w1", DEFAULT_TIER_WEIGHTS,  # type: ignore[arg-type]
                      lambda envs: asyncio.sleep(0))
    await drainer._step()
    # counted, picked (all held), then one wait of the 20 ms left, not the idle poll's
    assert queues.calls == ["backlogs", "read", "wait"]
    assert queues.timeouts == [0.02]
    assert not drainer.quiet
