"""OpenMP wait policy against decode step time: ``python -m engine.bench.omp_wait``.

libgomp reads its environment once, when torch loads it, so every setting runs in a fresh
child process (``--child``) with its own environment: ``OMP_WAIT_POLICY=PASSIVE`` (what
``carpool serve`` sets), ``GOMP_SPINCOUNT`` 2000 / 20000 / 200000 with ``OMP_WAIT_POLICY``
unset (libgomp spins about 100 000 times a millisecond, then sleeps on a futex), the default
(both unset: about 3 ms of spin), one torch thread (no parallel region ever wakes a second
thread), and a spin with one thread beside the neighbour (what a per-step thread count chosen
by contention would do, the contention known). Each child builds the fp32 engine, and for each
batch size R decodes R rows (seed-workload prompts, ``ignore_eos``) and times ``--steps`` decode steps quiet, then as many
with one busy neighbour process (a pure-Python loop: one core's worth, not pinned, as an
event loop or a Redis server would be). Settings run interleaved ``--repeats`` times, so the
machine's other load spreads over all of them. One table: per setting and batch size, the
median step ms of each repeat as median [min-max] over the repeats, and the CPU model; under
it the mean of /proc/stat's runnable tasks seen before each step, quiet and busy (the signal
such a thread count could read).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

# setting -> (environment entries, torch threads; 0 = the engine's default, one per core;
# -1 = the default quiet and 1 beside the neighbour: what a contention signal would choose)
SETTINGS: dict[str, tuple[dict[str, str], int]] = {
    "PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, 0),
    "GOMP_SPINCOUNT=2000": ({"GOMP_SPINCOUNT": "2000"}, 0),
    "GOMP_SPINCOUNT=20000": ({"GOMP_SPINCOUNT": "20000"}, 0),
    "GOMP_SPINCOUNT=200000": ({"GOMP_SPINCOUNT": "200000"}, 0),
    "default spin": ({}, 0),
    "1 thread (PASSIVE)": ({"OMP_WAIT_POLICY": "PASSIVE"}, 1),
    "GOMP_SPINCOUNT=20000, 1 thread when busy": ({"GOMP_SPINCOUNT": "20000"}, -1),
    # the engine's own choice (engine/runner/step_threads.py) before every step, busy or not
    "GOMP_SPINCOUNT=20000, adaptive threads": ({"GOMP_SPINCOUNT": "20000"}, -2),
}
_OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_SPIN = "GOMP_SPINCOUNT="
_BUSY_LOOP = "while True:\n    pass\n"


def setting(name: str) -> tuple[dict[str, str], int]:
    """A named setting, or any ``GOMP_SPINCOUNT=N`` (policy unset, the engine's threads)."""
    if name in SETTINGS:
        return SETTINGS[name]
    if name.startswith(_SPIN) and name[len(_SPIN):].isdigit():
        return {"GOMP_SPINCOUNT": name[len(_SPIN):]}, 0
    raise ValueError(f"unknown setting {name!r}: one of {list(SETTINGS)} or {_SPIN}N")


def child_env(name: str) -> dict[str, str]:
    """The parent's environment with the OpenMP wait variables replaced by the setting's."""
    env = {k: v for k, v in os.environ.items() if k not in _OMP_VARS}
    env.update(setting(name)[0])
    return env


def runnable() -> int:
    """Tasks runnable now, machine-wide (/proc/stat procs_running; the caller is one); -1 if
    unreadable. The contention signal a per-step thread choice could use."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _timed_steps(engine: Any, steps: int) -> tuple[float, float]:
    """Median wall ms of ``steps`` engine steps, and the mean ``runnable()`` before them
    (the engine's adaptive thread hook, if the setting has one, runs inside the timing)."""
    times, seen = [], []
    hook = getattr(engine, "step_threads", None)
    for _ in range(steps):
        seen.append(runnable())
        t0 = time.perf_counter()
        if hook is not None:
            hook.before_step()
        engine.step()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), statistics.mean(seen)


def measure_rows(engine: Any, rows: int, steps: int, warm: int,
                 busy_threads: int = 0) -> dict[str, float]:
    """Decode step ms at ``rows`` rows, quiet and beside one busy neighbour process (there on
    ``busy_threads`` torch threads if given), with the mean runnable tasks seen in each."""
    import torch

    from engine.bench.engine import make_workload
    from engine.core.sampling_params import SamplingParams

    n = warm + 2 * steps + 8  # no row finishes while timed
    wl = make_workload(engine.tokenizer, rows, n, n)
    for i, (prompt, max_tokens) in enumerate(zip(wl.prompts, wl.output_lens)):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(prompt, params, request_id=f"w{rows}-{i}")
    for _ in range(warm):  # prefill, then a few decode steps
        engine.step()
    quiet, quiet_seen = _timed_steps(engine, steps)
    threads = torch.get_num_threads()
    neighbour = subprocess.Popen([sys.executable, "-c", _BUSY_LOOP])
    try:
        if busy_threads:
            torch.set_num_threads(busy_threads)
        time.sleep(0.3)  # let it reach the loop
        busy, busy_seen = _timed_steps(engine, steps)
        busy_ran_on = torch.get_num_threads()
    finally:
        if busy_threads:  # an adaptive engine's hook owns the count: left to it
            torch.set_num_threads(threads)
        neighbour.kill()
        neighbour.wait()
    engine.abort_all()
    return {"quiet": quiet, "busy": busy, "quiet_runnable": quiet_seen,
            "busy_runnable": busy_seen, "quiet_threads": threads, "busy_threads": busy_ran_on}


def run_child(rows: list[int], steps: int, warm: int, threads: int,
              model: str | None = None) -> dict[str, Any]:
    """One setting, in this process (its environment was set by the parent)."""
    import torch

    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=model, dtype="float32", max_num_seqs=max(rows))
    if threads > 0:
        torch.set_num_threads(threads)
    busy_threads = 1 if threads == -1 else 0
    if threads == -2:  # the engine decides each step (a plain attribute: LLMEngine has none)
        from engine.runner.step_threads import StepThreads

        setattr(engine, "step_threads", StepThreads(True))  # noqa: B010 - LLMEngine has none
    measure_rows(engine, 2, 3, 3, busy_threads)  # warm-up: first-call costs, weight pages
    return {"threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in _OMP_VARS},  # what libgomp read
            "rows": {str(r): measure_rows(engine, r, steps, warm, busy_threads)
                     for r in rows}}


def spawn(name: str, rows: list[int], steps: int, warm: int,
          model: str | None = None) -> dict[str, Any]:
    """One setting in a fresh child process; its JSON result."""
    cmd = [sys.executable, "-m", "engine.bench.omp_wait", "--child",
           "--threads", str(setting(name)[1]), "--steps", str(steps), "--warm", str(warm),
           "--rows", *map(str, rows)] + (["--model", model] if model else [])
    print(f"  {name} ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=child_env(name), check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else 'unknown CPU'} x {os.cpu_count()}"


def cell(values: list[float]) -> str:
    """median [min-max] of the repeats' medians."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} [{min(values):.0f}-{max(values):.0f}]"


def table(results: dict[str, list[dict[str, Any]]], rows: list[int]) -> list[str]:
    """One line per setting: per batch size, quiet | busy-neighbour step ms."""
    cols = [f"{r} row{'s' if r > 1 else ''} {kind}" for r in rows for kind in ("quiet", "busy")]
    out = ["| setting | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, runs in results.items():
        cells = [cell([run["rows"][str(r)][kind] for run in runs])
                 for r in rows for kind in ("quiet", "busy")]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def runnable_line(results: dict[str, list[dict[str, Any]]]) -> str:
    """The contention signal's mean over every cell, quiet and busy."""
    cells = [c for runs in results.values() for run in runs for c in run["rows"].values()]
    quiet = statistics.mean(c["quiet_runnable"] for c in cells)
    busy = statistics.mean(c["busy_runnable"] for c in cells)
    return (f"runnable tasks before a step (/proc/stat procs_running, the step thread one of "
            f"them), mean: quiet {quiet:.2f}, busy {busy:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.omp_wait", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=15, help="timed steps per condition")
    ap.add_argument("--warm", type=int, default=4, help="untimed steps first (prefill)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS),
                    help=f"of {list(SETTINGS)}, or any {_SPIN}N")
    ap.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name in args.settings:
        setting(name)  # unknown names fail before any child runs
    if args.child:
        print(json.dumps(run_child(args.rows, args.steps, args.warm, args.threads, args.model)))
        return 0
    load0 = os.getloadavg()[0]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in args.settings}
    for _ in range(args.repeats):
        for name in args.settings:  # interleaved: the machine's load spreads over all
            results[name].append(spawn(name, args.rows, args.steps, args.warm, args.model))
    print(f"decode step ms, SmolLM2 fp32, {cpu_model()}; median step of {args.steps} per "
          f"cell, median [min-max] over {args.repeats} interleaved repeats; busy = one "
          f"pure-Python busy process beside it; load average {load0:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("\n".join(table(results, args.rows)))
    print(runnable_line(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
