"""``gateway/process.py``. ``carpool serve`` freezes the objects alive after start-up, so full
GC passes stop walking the imports, tokenizer and model; apps made without ``freeze_gc``
(tests) leave the GC alone. The free port, the loop runner, the stop signals and the bounded
stop of child processes."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway import process
from gateway.process import free_port, run_loop, stop_children
from tests.gateway.harness import make_config, run_gateway
from tests.gateway.procs import REPO

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("freeze", [False, True])
def test_freeze_after_startup(redis_url: str, tiny_model_dir: Path, freeze: bool) -> None:
    gc.unfreeze()
    config = make_config(engine="echo", model=str(tiny_model_dir))
    try:
        with run_gateway(config, redis_url, freeze_gc=freeze) as gw:
            assert httpx.get(gw.url + "/healthz").status_code == 200
            frozen = gc.get_freeze_count()
            assert (frozen > 10_000) if freeze else frozen == 0
        # unfrozen on shutdown: frozen objects are never finalized, and triton's bindings
        # report each one as leaked at exit
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()  # the rest of the session collects as usual


def test_free_port_is_free() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # raises if somebody holds it


def test_free_port_is_below_the_ephemeral_range_when_the_os_says_where_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text("40000\t60999\n")
    monkeypatch.setattr(process, "EPHEMERAL_RANGE", str(tmp_path / "range"))
    ports = {free_port() for _ in range(20)}
    assert all(process.PORT_FLOOR <= p < 40000 for p in ports), ports
    assert len(ports) > 1  # picked at random: two processes asking at once get apart


def test_free_port_falls_back_to_the_os_pick_without_a_range(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "EPHEMERAL_RANGE", str(tmp_path / "missing"))
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low <= free_port() <= high


def test_run_loop_runs_on_uvloop_when_installed() -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert run_loop(loop_module()).split(".")[0] == expected


SIGNALLED = """
import asyncio, os, signal, sys
from gateway.process import exit_cleanly_on_sigterm, run_loop, stop_event
async def wait_for_stop() -> None:
    stop = stop_event()
    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIG{sig})
    await asyncio.wait_for(stop.wait(), 10)
    print("stop event set")
if sys.argv[1] == "loop":
    run_loop(wait_for_stop())
else:
    exit_cleanly_on_sigterm()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    finally:
        print("finally ran")
"""


@pytest.mark.parametrize(("mode", "sig", "printed"), [
    ("plain", "TERM", "finally ran"), ("loop", "TERM", "stop event set"),
    ("loop", "INT", "stop event set")])
def test_stop_signals(mode: str, sig: str, printed: str) -> None:
    """SIGTERM ends a plain process through ``finally`` with exit code 0; on a loop that is not
    uvicorn's, SIGINT and SIGTERM set the stop event."""
    done = subprocess.run([sys.executable, "-c", SIGNALLED.format(sig=sig), mode],
                          check=False, cwd=str(REPO), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == printed


def _child(ignore_term: bool) -> subprocess.Popen[bytes]:
    """A python child that prints "up" once its handlers are set, then sleeps."""
    code = ("import signal, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('up', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_stop_children_kills_one_that_ignores_sigterm(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    polite, stubborn = _child(False), _child(True)
    stop_children([polite, stubborn], timeout_s=1.0)
    assert polite.returncode == -15 and stubborn.returncode == -9
    err = capsys.readouterr().err
    assert f"pid {stubborn.pid} still running" in err and f"pid {polite.pid}" not in err
