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
    assert engine_has_capacity(make_load(num_running=7), priority=0)
    assert engine_has_capacity(make_load(num_running=6), priority=2)


def test_lower_tiers_leave_the_last_seats_to_interactive() -> None:
    """With 32 seats, batch may not take the last 4: an interactive arrival then finds a
    seat instead of preempting (issue 11, the small-seat row)."""
    for running in range(32):
        load = make_load(num_running=running, max_num_seqs=32, lowest_running_priority=1)
        assert engine_has_capacity(load, priority=1) == (32 - running > 4), running
        assert engine_has_capacity(load, priority=0)


# ---- priority inversion: lower-priority queued work does not block more urgent work ----

def _evicted_best_effort_load() -> EngineLoad:
    """Four best-effort requests evicted by preemption wait in the engine; four run."""
    return make_load(num_running=4, num_waiting=4, max_num_seqs=8, lowest_running_priority=1,
                     waiting_by_priority=((2, 4),))


def test_evicted_best_effort_no_longer_blocks_interactive() -> None:
    load = _evicted_best_effort_load()
    assert engine_has_capacity(load, priority=0)
    assert engine_has_capacity(load, priority=1)
    assert not engine_has_capacity(load, priority=2)  # they still block their own tier


def test_without_a_breakdown_every_waiting_request_counts() -> None:
    load = make_load(num_running=4, num_waiting=4, max_num_seqs=8, lowest_running_priority=1)
    assert not any(engine_has_capacity(load, p) for p in range(3))


def test_requests_of_unknown_priority_count_as_urgent() -> None:
    # 5 waiting, of which the engine placed 2 at best-effort: 3 (still in its inbox) are urgent
    from policies.admission import waiting_ahead

    load = make_load(num_waiting=5, waiting_by_priority=((2, 2),))
    assert waiting_ahead(load, 0) == 3 and waiting_ahead(load, 2) == 5


def _reference_room(running: int, waiting: list[int], unknown: int, swapped: list[int],
                    max_seqs: int, free_blocks: int, total_blocks: int, lowest: int | None,
                    p: int) -> bool:
    """The room rule written out over the queued requests' priorities: its own priority's
    queue (plus the not yet placed) short, and a seat left once everything at least as
    urgent runs with blocks to spare, or less urgent running work to preempt."""
    if sum(w == p for w in waiting) + unknown >= MAX_ENGINE_WAITING:
        return False
    ahead = running + sum(w <= p for w in waiting) + unknown + sum(s <= p for s in swapped)
    reserve = 0 if p == 0 else max_seqs // 8  # seats kept for interactive
    if max_seqs - ahead > reserve and free_blocks / total_blocks > 0.05:
        return True
    return lowest is not None and lowest > p


def test_room_rule_equals_a_straightforward_one() -> None:
    import random

    from policies.admission import by_priority, free_seats

    rng = random.Random(7)
    for _ in range(2000):
        waiting = [rng.randrange(3) for _ in range(rng.randrange(10))]
        swapped = [rng.randrange(3) for _ in range(rng.randrange(4))]
        unknown = rng.randrange(3)  # posted, not applied yet
        max_seqs = rng.randrange(1, 12)
        running = rng.randrange(max_seqs + 1)
        lowest = rng.choice([None, 0, 1, 2]) if running else None
        free = rng.choice([0, 3, 50, 100])
        load = make_load(num_running=running, num_waiting=len(waiting) + unknown,
                         num_swapped=len(swapped), num_free_blocks=free, max_num_seqs=max_seqs,
                         lowest_running_priority=lowest, waiting_by_priority=by_priority(waiting),
                         swapped_by_priority=by_priority(swapped))
        for p in range(3):
            want = _reference_room(running, waiting, unknown, swapped, max_seqs, free, 100,
                                   lowest, p)
            assert engine_has_capacity(load, p) == want, (load, p)
            urgent = make_load(
                num_running=running, num_waiting=sum(w <= p for w in waiting) + unknown,
                num_swapped=sum(s <= p for s in swapped), num_free_blocks=free,
                max_num_seqs=max_seqs, lowest_running_priority=lowest)
            assert free_seats(load, p) == free_seats(urgent)
        assert free_seats(load) == max_seqs - running - len(waiting) - unknown - len(swapped)


def test_a_full_batch_queue_does_not_keep_best_effort_out() -> None:
    """Every tier backlogged: four batch requests wait in the engine (its queue is full), a
    best-effort one may still be pulled (the engine's row cap gives it its own seats)."""
    load = make_load(num_running=20, num_waiting=MAX_ENGINE_WAITING, max_num_seqs=64,
                     lowest_running_priority=2,
                     waiting_by_priority=((1, MAX_ENGINE_WAITING),))
    assert not engine_has_capacity(load, priority=1)
    assert engine_has_capacity(load, priority=2)
    assert engine_has_capacity(load, priority=0)
