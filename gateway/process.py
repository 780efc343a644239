"""What a serving process sets up around its event loop, written once for ``carpool serve`` (every
role), the benchmarks and the load test's local server:

  free_port               a loopback TCP port nobody listens on, outside the ephemeral range
  run_loop                run a coroutine on uvloop when installed (what uvicorn picks too)
  startup_objects_frozen  the objects alive after start-up moved out of the cyclic GC's reach
  exit_cleanly_on_sigterm SIGTERM -> ``SystemExit(0)``, so ``finally`` blocks and atexit run
  stop_event              set by SIGINT/SIGTERM, for a loop without uvicorn (the worker role)
  child_env               the environment for a server process this one starts
  stop_children           SIGTERM to processes this one started, SIGKILL past a time bound
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


# Ports handed out below the OS's ephemeral range start here (above the well-known services).
PORT_FLOOR = 20000
# drawn from the OS: a test or library that seeds ``random`` cannot make two processes draw
# the same ports
_PORTS = random.SystemRandom()
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, for a server started later (another process may
    still take it before use).

    Picked at random below the ephemeral range where the OS says where that starts: an
    outgoing connection takes its local port from that range, so one made between this call
    and the server's bind can never take the port (the OS's own pick, port 0, comes from it);
    the random pick keeps two processes choosing at once apart. Elsewhere, the OS's pick."""
    top = _ephemeral_low()
    for _ in range(32 if top > PORT_FLOOR + 1000 else 0):
        port = _PORTS.randrange(PORT_FLOOR, top)
        if _bindable(host, port):
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the ephemeral range, 0 where it cannot be read (not Linux)."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def loop_factory() -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """The event loop's name and factory: uvloop when installed (None: asyncio's own)."""
    try:
        import uvloop
    except ImportError:
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when installed, as uvicorn does for the HTTP roles: a worker
    process's loop carries the per-step writes, and asyncio's own timers overshoot by up to a
    millisecond whenever the loop waits on a socket (measured in ``carpool bench gateway``)."""
    with asyncio.Runner(loop_factory=loop_factory()[1]) as runner:
        return runner.run(coro)


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """Move everything alive after start-up (modules, tokenizer, model) out of the cyclic
    GC's reach while serving. A full collection walks every tracked object: ~300k after the
    imports, a ~100-200 ms pause that lands on the requests in flight (the p99 in ``carpool
    bench gateway``); frozen, it walks only what serving allocated. Unfrozen on the way out:
    frozen objects are never finalized at exit, and triton's nanobind bindings then print
    hundreds of "leaked instance" lines on every stop."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM -> SystemExit(0), so ``finally`` and atexit run (they stop an embedded Redis).
    uvicorn re-raises the SIGTERM it caught once its graceful shutdown is done; under the
    default action the process died right there (status -15, an embedded Redis left
    running). ``carpool serve`` installs it in every role."""

    def handler(_signum: int, _frame: object) -> None:
        raise SystemExit(0)  # a requested stop that completed

    signal.signal(signal.SIGTERM, handler)


def stop_event() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets, handled on the running loop from now on (for a
    loop uvicorn does not run: the worker role)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def child_env(**overrides: str) -> dict[str, str]:
    """This process's environment plus ``overrides``, for a ``carpool serve`` it starts (the
    benchmarks): handed on whole, never read here, so settings reach the child unchanged."""
    return {**os.environ, **overrides}


def stop_children(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM to each, then wait at most ``timeout_s`` for all of them together; one still
    running then is killed (SIGKILL) and named on stderr. Only the direct children: what a
    killed child started itself is its own to stop (``carpool serve`` stops its embedded
    Redis in a ``finally`` that a SIGKILL skips). Why a bound: a benchmark's table comes after
    its servers stop, and a server that hung in its shutdown (seen once: 7 min after SIGTERM,
    every thread idle) must not take the table with it."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"pid {proc.pid} still running {timeout_s:.0f} s after SIGTERM: killed",
                  file=sys.stderr, flush=True)
            proc.kill()
            proc.wait()
