"""The step-thread hook: /proc/stat's procs_running is parsed, and the async engine's step
thread changes its torch thread count only when ``adaptive_threads`` is on."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
import torch

from engine.core.sampling_params import SamplingParams
from engine.frontend.async_engine import AsyncEngine
from engine.runner.step_threads import (
    StepThreads,
    cores,
    own_running_tasks,
    parse_procs_running,
    runnable_tasks,
    task_state,
)

STAT = (b"cpu  2255 34 2290 22625563 6290 127 456 0 0 0\n"
        b"cpu0 1132 34 1441 11311718 3675 127 438 0 0 0\n"
        b"intr 114930548 113199788 3 0 5 263 0 4 [... lots more numbers ...]\n"
        b"ctxt 1990473\nbtime 1062191376\nprocesses 2915\n"
        b"procs_running 3\nprocs_blocked 0\nsoftirq 183433 0 21755 12 39 1137 231 21459 2263\n")


def test_parses_procs_running_from_a_proc_stat_text() -> None:
    assert parse_procs_running(STAT) == 3
    assert parse_procs_running(STAT.replace(b"procs_running 3", b"procs_running x")) == -1
    assert parse_procs_running(b"cpu 1 2 3\n") == -1


def test_reads_this_machines_proc_stat(tmp_path: Path) -> None:
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    assert runnable_tasks() >= 1  # the reader itself is running
    assert runnable_tasks(str(tmp_path / "missing")) == -1


async def _threads_seen(model_dir: Path, adaptive: bool, stat: Path) -> tuple[list[int], int]:
    engine = AsyncEngine.from_kwargs(model=str(model_dir), dtype="float32", num_blocks=64,
                                     adaptive_threads=adaptive)
    engine.step_threads.path = str(stat)  # a neighbour that always holds a core
    seen: list[int] = []
    engine.add_step_observer(lambda out, s: seen.append(torch.get_num_threads()))  # step thread
    await engine.start()
    try:
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        outs = [o async for o in engine.generate("a", [5, 6, 7, 8], params)]
        assert outs[-1].finished
    finally:
        await engine.shutdown()
        await asyncio.sleep(0)
    return seen, engine.step_threads.changes


@pytest.mark.skipif(cores() < 2, reason="needs 2 cores to have a thread to drop")
@pytest.mark.parametrize("adaptive", [False, True])
async def test_the_step_thread_drops_to_one_thread_only_when_adaptive(
        tiny_model_dir: Path, tmp_path: Path, adaptive: bool) -> None:
    stat = tmp_path / "stat"
    stat.write_bytes(STAT.replace(b"procs_running 3", f"procs_running {cores() + 1}".encode()))
    seen, changes = await _threads_seen(tiny_model_dir, adaptive, stat)
    if adaptive:
        assert changes >= 1 and seen[-1] == 1  # every core held by others: one thread
        later: list[int] = []  # a thread started after the loop stopped: count restored
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [seen[0]]
    else:
        assert changes == 0 and seen[-1] == seen[0] > 1


def _task_dir(tmp_path: Path, states: list[str]) -> Path:
    tasks = tmp_path / "task"
    for tid, state in enumerate(states, start=100):
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "stat").write_bytes(
            f"{tid} (py (worker) x) {state} 1 2 3 4".encode())
    return tasks


def test_counts_this_processs_running_tasks(tmp_path: Path) -> None:
    assert task_state(b"7 (a) b) c) S 1") == b"S"  # the name may hold ") "
    assert task_state(b"") == b""
    assert own_running_tasks(str(_task_dir(tmp_path, ["R", "S", "R", "D"]))) == 2
    assert own_running_tasks(str(tmp_path / "missing")) == -1
    if os.path.exists("/proc/self/task"):
        assert own_running_tasks() >= 1  # the reader itself is running


@pytest.mark.parametrize("ours", [1, 2])
def test_our_own_running_tasks_are_not_neighbours(tmp_path: Path, ours: int) -> None:
    """Two tasks running machine-wide for several steps: a neighbour holds a core only when
    one of them is not ours (spinning OpenMP workers and the event loop are ours)."""
    stat = tmp_path / "stat"
    stat.write_bytes(STAT.replace(b"procs_running 3", b"procs_running 2"))
    hook = StepThreads(True, str(stat), str(_task_dir(tmp_path, ["R"] * ours + ["S"])))
    try:
        for _ in range(10):
            hook.before_step()
    finally:
        hook.restore()
    assert hook.state.held == (1 if ours == 1 else 0)
