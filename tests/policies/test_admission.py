from __future__ import annotations

from engine.protocol import EngineLoad
from policies.admission import MAX_ENGINE_WAITING, engine_has_capacity


def make_load(**overrides: object) -> EngineLoad:
    base: dict[str, object] = {
        "num_running": 0, "num_waiting": 0, "num_swapped": 0, "num_free_blocks": 100,
        "num_total_blocks": 100, "max_num_seqs": 8, "lowest_running_priority": None,
    }
    base.update(overrides)
    return EngineLoad(**base)  # type: ignore[arg-type]


def test_idle_engine_has_capacity() -> None:
    assert engine_has_capacity(make_load(), priority=2)


def test_full_seats_block_equal_priority_but_not_higher() -> None:
    load = make_load(num_running=8, lowest_running_priority=1)
    assert not engine_has_capacity(load, priority=1)
    assert not engine_has_capacity(load, priority=2)
    assert engine_has_capacity(load, priority=0)  # may preempt the batch-tier work


def test_no_free_blocks_blocks_admission() -> None:
    load = make_load(num_running=2, num_free_blocks=2, lowest_running_priority=0)
    assert not engine_has_capacity(load, priority=0)


def test_long_engine_queue_stops_pulling() -> None:
    load = make_load(num_waiting=MAX_ENGINE_WAITING, lowest_running_priority=2)
    assert not engine_has_capacity(load, priority=0)
