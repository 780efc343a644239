from __future__ import annotations

from policies.admission import MAX_ENGINE_WAITING, EngineLoad, engine_has_capacity


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


def test_pull_count_is_the_free_seats_within_one_and_max_pull() -> None:
    from policies.admission import MAX_PULL, pull_count

    for running, waiting, swapped, max_seqs in [(0, 0, 0, 100), (3, 1, 2, 10), (5, 4, 1, 10),
                                                (9, 0, 0, 10), (16, 2, 0, 16), (0, 0, 0, 3)]:
        load = make_load(num_running=running, num_waiting=waiting, num_swapped=swapped,
                         max_num_seqs=max_seqs)
        seats = max_seqs - running - waiting - swapped  # what is left once all of it runs
        expected = 1 if seats < 1 else min(seats, MAX_PULL)
        assert pull_count(load) == expected, (running, waiting, swapped, max_seqs)
    assert pull_count(make_load(), max_pull=3) == 3


def test_an_engine_that_never_preempts_has_no_room_when_full() -> None:
    full = make_load(num_running=8, lowest_running_priority=None)
    assert not any(engine_has_capacity(full, p) for p in range(3))
    assert engine_has_capacity(make_load(num_running=7), priority=2)
