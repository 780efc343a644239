"""Per-step torch thread count on the step thread (``EngineConfig.adaptive_threads``).

``StepThreads.before_step()`` is called by the step loop before each step, on the step thread
(OpenMP's thread count is per calling thread): it reads the machine's runnable tasks
(``/proc/stat`` ``procs_running``) and this process's own running tasks (``/proc/self/task``:
the step thread, OpenMP workers still spinning after the last step, the event loop), feeds ``policies.step_threads`` and calls
``torch.set_num_threads`` only when the chosen count changes. Off (the default, as in tests and
the offline ``LLM``) it does nothing: oneDNN's summation order, so fp32 rounding, may differ
between thread counts, and results stay reproducible. Where ``/proc/stat`` cannot be read the
count never changes.
"""

from __future__ import annotations

import os

import torch

from policies.step_threads import Contention, observe, threads

PROC_STAT = "/proc/stat"
OWN_TASKS = "/proc/self/task"
_KEY = b"procs_running"


def parse_procs_running(text: bytes) -> int:
    """``procs_running N`` from /proc/stat's contents; -1 if absent or malformed."""
    for line in text.splitlines():
        if line.startswith(_KEY):
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                return int(parts[1])
    return -1


def runnable_tasks(path: str = PROC_STAT) -> int:
    """Tasks runnable now, machine-wide (the caller is one of them); -1 if unreadable."""
    try:
        with open(path, "rb") as f:
            return parse_procs_running(f.read())
    except OSError:
        return -1


def task_state(stat: bytes) -> bytes:
    """The state letter of a ``/proc/<pid>/task/<tid>/stat`` text (after the command name,
    which may hold spaces and parentheses); b"" if malformed."""
    fields = stat[stat.rfind(b")") + 1:].split()
    return fields[0] if fields else b""


def own_running_tasks(task_dir: str = OWN_TASKS) -> int:
    """This process's tasks runnable now (the caller is one); -1 if unreadable. Why: served,
    the spinning OpenMP workers and the event loop are ours; counted as neighbours they made
    the step drop to one thread (bench serve, 100 streams: 49% of 2 cores used)."""
    try:
        names = os.listdir(task_dir)
    except OSError:
        return -1
    running = 0
    for name in names:
        try:
            with open(os.path.join(task_dir, name, "stat"), "rb") as f:
                running += task_state(f.read()) == b"R"
        except OSError:
            continue  # the task ended meanwhile
    return running


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class StepThreads:
    """The thread choice of one step thread; ``configured`` is read on its first step."""

    def __init__(self, enabled: bool, path: str = PROC_STAT, tasks: str = OWN_TASKS) -> None:
        self.enabled = enabled
        self.path = path
        self.tasks = tasks
        self.state = Contention()
        self.configured = 0  # torch's count on the step thread before the first change
        self.current = 0
        self.changes = 0  # how many times it switched (stats, tests)

    def before_step(self) -> None:
        if not self.enabled:
            return
        if not self.configured:
            self.configured = self.current = torch.get_num_threads()
        own = max(1, own_running_tasks(self.tasks))  # unreadable: the step thread alone
        self.state = observe(self.state, runnable_tasks(self.path), own)
        chosen = threads(self.state, self.configured, cores())
        if chosen != self.current:
            torch.set_num_threads(chosen)
            self.current = chosen
            self.changes += 1

    def restore(self) -> None:
        """Back to the configured count (torch keeps the last count for threads started
        later, so a stopped step loop must not leave 1 behind)."""
        if self.configured and self.current != self.configured:
            torch.set_num_threads(self.configured)
            self.current = self.configured
