"""Where the CPU went during the served row of ``carpool bench serve`` (Linux ``/proc``).

On a 2-core machine every CPU second the event loop, Redis or the client spend is one the
engine's matmuls do not get, so the served row's loss against offline is read as CPU seconds,
which a busy neighbour does not distort as it does wall time: the serving process's main
thread (event loop: HTTP, auth, relay, Redis I/O), its other threads (the engine's step thread
and its OpenMP workers), the Redis server, and this client process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_s(stat: Path) -> float:
    # fields after the ")" of comm: utime and stime are the 12th and 13th
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (empty off Linux or when it is gone)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out[int(task.name)] = _cpu_s(task / "stat")
        except (OSError, ValueError, IndexError):
            continue
    return out


def find_pid(*needles: str) -> int | None:
    """The first process whose command line contains every needle."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(n in cmd for n in needles):
            return int(proc.name)
    return None


@dataclass
class CpuSnapshot:
    server: dict[int, float]
    redis: float
    client: float


def snapshot(server_pid: int, redis_pid: int | None) -> CpuSnapshot:
    redis = sum(threads_cpu(redis_pid).values()) if redis_pid else 0.0
    times = os.times()
    return CpuSnapshot(threads_cpu(server_pid), redis, times.user + times.system)


def split_line(server_pid: int, before: CpuSnapshot, after: CpuSnapshot, wall_s: float) -> str:
    """CPU seconds between the snapshots, by part, and as a share of the cores' wall time."""
    main = after.server.get(server_pid, 0.0) - before.server.get(server_pid, 0.0)
    rest = sum(v - before.server.get(t, 0.0) for t, v in after.server.items() if t != server_pid)
    redis, client = after.redis - before.redis, after.client - before.client
    cores = os.cpu_count() or 1
    budget = cores * wall_s
    parts = {"engine threads (step + OpenMP)": rest, "event loop (main thread)": main,
             "Redis server": redis, "bench client": client}
    text = ", ".join(f"{k} {v:.1f} s ({100 * v / budget:.0f}%)" for k, v in parts.items())
    return f"CPU during the served row ({cores} cores x {wall_s:.1f} s = {budget:.0f} s): {text}"
