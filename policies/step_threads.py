"""The step thread's torch thread count, chosen each step by contention (pure functions).

Why (``python -m engine.bench.omp_wait``, 2-core AMD EPYC VM): with ``GOMP_SPINCOUNT=20000`` a
decode step is faster than under ``OMP_WAIT_POLICY=PASSIVE`` while no other task wants a core
(1 row 32 vs 42 ms), but 2-3x slower beside one busy neighbour, where one thread holds (47 vs
52 ms). So: every configured thread while quiet, fewer while others hold cores.

The signal is the machine's runnable-task count read before each step (``/proc/stat``
``procs_running``), less ``own`` (this process's running tasks: the step thread reading it,
OpenMP workers still spinning, the event loop): the other tasks that want a core. Counting our
own as neighbours dropped a served engine to one thread (bench serve: 49% of 2 cores used). Measured before each step: 1.24 quiet, 2.51 beside one busy process.

The rule, per sample: ``level`` = EWMA of the others (weight ``alpha`` for the newest sample),
then ``held`` (cores deemed held by others) moves with hysteresis: up to k while
``level >= k - 1 + enter``, down while ``level <= held - 1 + leave``; between the two it stays.
So one event-loop burst (a single sample of 2 others) does not flip it, a neighbour holding a
core for a few steps does. Threads = ``max(1, min(configured, cores - held))``: on 2 cores,
2 threads quiet and 1 while a neighbour runs.
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.3  # EWMA weight of the newest sample: a sustained neighbour is seen in ~3 steps
ENTER = 0.9  # smoothed others at or above held + ENTER: one more core held
LEAVE = 0.4  # at or below held - 1 + LEAVE: one core fewer held


@dataclass(frozen=True)
class Contention:
    """The smoothed count of other runnable tasks and the cores deemed held by them."""

    level: float = 0.0
    held: int = 0


def observe(state: Contention, runnable: int, own: int = 1, alpha: float = ALPHA,
            enter: float = ENTER, leave: float = LEAVE) -> Contention:
    """The state after one ``runnable`` sample (machine-wide, ``own`` of them ours); a
    negative sample (unreadable) leaves it as it was."""
    if runnable < 0:
        return state
    others = max(0, runnable - own)
    level = (1 - alpha) * state.level + alpha * others
    held = state.held
    while level >= held + enter:
        held += 1
    while held > 0 and level <= held - 1 + leave:
        held -= 1
    return Contention(level, held)


def threads(state: Contention, configured: int, cores: int) -> int:
    """Torch threads for the next step: the configured count less the cores held, at least 1."""
    return max(1, min(configured, cores - state.held))
