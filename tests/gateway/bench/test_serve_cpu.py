"""The CPU split of ``carpool bench serve`` reads /proc per thread: a thread's figure agrees with
its own ``time.thread_time()``, and the split line adds up what changed between snapshots."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from gateway.bench.serve_cpu import CpuSnapshot, find_pid, split_line, threads_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_a_threads_cpu_is_its_thread_time() -> None:
    seen: dict[str, float] = {}

    def burn() -> None:
        seen["tid"] = threading.get_native_id()
        x = 0
        for i in range(3_000_000):
            x += i * i
        seen["own"] = time.thread_time()
        seen["proc"] = threads_cpu(os.getpid())[threading.get_native_id()]
        seen["after"] = time.thread_time()  # reading /proc costs this thread CPU too

    t = threading.Thread(target=burn)
    t.start()
    t.join()
    assert seen["own"] > 0.05
    # /proc counts in clock ticks, and it was read between the two thread_time() calls
    assert seen["own"] - 0.03 <= seen["proc"] <= seen["after"] + 0.03


def test_find_pid_finds_a_process_by_its_command_line() -> None:
    marker = f"find-pid-marker-{os.getpid()}"
    assert find_pid(marker) is None
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        deadline = time.monotonic() + 10
        while find_pid(marker) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert find_pid("time.sleep(60)", marker) == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_split_line_sums_the_deltas() -> None:
    before = CpuSnapshot({10: 1.0, 11: 2.0}, redis=0.5, client=3.0)
    after = CpuSnapshot({10: 1.5, 11: 4.0, 12: 1.0}, redis=0.75, client=3.25)
    line = split_line(10, before, after, wall_s=10.0)
    assert "engine threads (step + OpenMP) 3.0 s" in line
    assert "event loop (main thread) 0.5 s" in line
    assert "Redis server 0.2 s" in line and "bench client 0.2 s" in line
