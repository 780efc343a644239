"""engine/bench/omp_wait.py: each setting's child sees exactly that setting's OpenMP
variables (libgomp reads them once, at load, so a leaked PASSIVE from the parent, as
tests/conftest.py and `carpool serve` set, would make every row measure PASSIVE), runs at the
setting's thread count and returns a step time per batch size and condition; the table prints
median [min-max] over repeats. No timing is asserted."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest

from engine.bench import omp_wait


def test_child_env_replaces_the_parents_openmp_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    spin = omp_wait.child_env("GOMP_SPINCOUNT=20000")
    assert "OMP_WAIT_POLICY" not in spin and spin["GOMP_SPINCOUNT"] == "20000"
    default = omp_wait.child_env("default spin")
    assert "OMP_WAIT_POLICY" not in default and "GOMP_SPINCOUNT" not in default
    passive = omp_wait.child_env("PASSIVE")
    assert passive["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in passive
    assert spin["PATH"] == os.environ["PATH"]  # the rest is the parent's


def test_a_child_runs_under_its_setting(tiny_model_dir: Path) -> None:
    # this process has OMP_WAIT_POLICY=PASSIVE (tests/conftest.py): the child must not
    res = omp_wait.spawn("GOMP_SPINCOUNT=2000", [1, 3], steps=2, warm=2,
                         model=str(tiny_model_dir))
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert res["env"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "2000"}
    assert res["threads"] == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else os.cpu_count())
    assert set(res["rows"]) == {"1", "3"}
    for cond in res["rows"].values():
        assert set(cond) == {"quiet", "busy", "quiet_runnable", "busy_runnable",
                             "quiet_threads", "busy_threads"}
        assert cond["quiet"] > 0 and cond["busy"] > 0
        assert cond["busy_runnable"] >= 1  # the step thread itself, at least


def test_table_prints_median_and_range_over_repeats() -> None:
    runs = [{"rows": {"1": {"quiet": q, "busy": b}}} for q, b in ((30.0, 90.0), (50.0, 70.0),
                                                                  (40.0, 80.0))]
    lines = omp_wait.table({"PASSIVE": runs}, [1])
    assert lines[0] == "| setting | 1 row quiet | 1 row busy |"
    quiet = statistics.median([30.0, 50.0, 40.0])
    assert lines[2] == f"| PASSIVE | {quiet:.1f} [30-50] | 80.0 [70-90] |"
    assert omp_wait.cell([12.34]) == "12.3"


def test_busy_phase_on_one_thread_then_the_threads_come_back(tiny_model_dir: Path) -> None:
    import torch

    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", max_num_seqs=2)
    before = torch.get_num_threads()
    res = omp_wait.measure_rows(engine, 2, steps=1, warm=2, busy_threads=1)
    assert res["quiet_threads"] == before and res["busy_threads"] == 1
    assert torch.get_num_threads() == before
    assert not engine.has_unfinished_requests()


def test_runnable_reads_proc_stat() -> None:
    with open("/proc/stat") as f:
        assert any(line.startswith("procs_running") for line in f)
    assert omp_wait.runnable() >= 1  # this test's own thread is running


def test_any_spin_count_is_a_setting_and_unknown_names_fail() -> None:
    assert omp_wait.setting("GOMP_SPINCOUNT=777") == ({"GOMP_SPINCOUNT": "777"}, 0)
    assert omp_wait.setting("1 thread (PASSIVE)") == ({"OMP_WAIT_POLICY": "PASSIVE"}, 1)
    for bad in ("GOMP_SPINCOUNT=", "GOMP_SPINCOUNT=-5", "ACTIVE"):
        with pytest.raises(ValueError):
            omp_wait.setting(bad)
