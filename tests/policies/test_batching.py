from __future__ import annotations

from typing import Any

import pytest

from policies.batching import (
    AdmissionSnapshot,
    continuous,
    dynamic,
    get_admission_policy,
    padding_rows,
    static,
)


def snap(**kw: Any) -> AdmissionSnapshot:
    base: dict[str, Any] = {
        "now": 100.0, "num_running": 0, "num_waiting": 10, "oldest_waiting_arrival": 100.0,
        "max_num_seqs": 4, "max_wait_ms": 50.0, "batch_filling": False,
    }
    base.update(kw)
    return AdmissionSnapshot(**base)


def test_continuous_has_no_cap_of_its_own() -> None:
    assert continuous(snap(num_running=3)) == 10
    assert continuous(snap(num_running=4, num_waiting=2)) == 2


def test_static_admits_only_into_an_empty_engine() -> None:
    assert static(snap()) == 4
    assert static(snap(num_running=1)) == 0
    assert static(snap(num_running=3)) == 0


def test_static_keeps_filling_a_batch_cut_short() -> None:
    assert static(snap(num_running=2, batch_filling=True)) == 2


def test_dynamic_waits_for_a_full_batch_or_the_timeout() -> None:
    assert dynamic(snap(num_waiting=3, oldest_waiting_arrival=100.0)) == 0
    assert dynamic(snap(num_waiting=3, oldest_waiting_arrival=100.0 - 0.049)) == 0
    assert dynamic(snap(num_waiting=3, oldest_waiting_arrival=100.0 - 0.051)) == 4
    assert dynamic(snap(num_waiting=4)) == 4  # full
    assert dynamic(snap(num_waiting=4, num_running=1)) == 0  # a batch is still running
    assert dynamic(snap(num_waiting=0, oldest_waiting_arrival=None)) == 0
    assert dynamic(snap(num_running=1, batch_filling=True)) == 3


def test_fixed_shape_modes_pad_finished_seats_and_continuous_never_does() -> None:
    for mode in ("static", "dynamic"):
        assert padding_rows(mode, batch_seats=4, num_running=4) == 0
        assert padding_rows(mode, batch_seats=4, num_running=1) == 3
        assert padding_rows(mode, batch_seats=4, num_running=0) == 0  # the batch is over
    assert padding_rows("continuous", batch_seats=4, num_running=1) == 0


def test_unknown_mode_is_rejected() -> None:
    assert get_admission_policy("static") is static
    with pytest.raises(ValueError, match="unknown batching mode"):
        get_admission_policy("greedy")
