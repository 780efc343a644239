"""``carpool serve`` with the embedded Redis, as a user runs it: the printed curl line works the
moment it is printed, and Ctrl-C or SIGTERM stops the process cleanly (exit 0, no traceback)
and the Redis server it started."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.process import free_port
from tests.gateway.procs import Proc, _ready

pytestmark = pytest.mark.timeout(120)

CARPOOL = Path(sys.executable).parent / "carpool"  # the console script `make setup` installs

# the real engine on the tiny model: it loads while the HTTP port is still closed
TINY = ("--num-blocks", "64", "--block-size", "16", "--max-num-seqs", "4",
        "--max-model-len", "256")


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def _serve(model_dir: Path, state_dir: Path, *extra: str) -> Iterator[Proc]:
    """``carpool serve`` through the installed entry point, run outside the checkout as a user
    runs it (so the installed packages, not the repo's folders, are what Python finds first:
    a clashing ``kernels`` distribution fails here), in a session of its own, so a test can
    signal its whole process group as a terminal's Ctrl-C does."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    env.update(CARPOOL_STATE_DIR=str(state_dir), PYTHONUNBUFFERED="1")
    popen = subprocess.Popen(
        [str(CARPOOL), "serve", "--model", str(model_dir), "--port", str(port), *extra],
        cwd=str(state_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        yield Proc(popen, port)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)


def _curl_request(lines: list[str]) -> tuple[str, dict[str, str], dict[str, object]] | None:
    """URL, headers and JSON body of the printed curl command, once all of it is printed."""
    text = "".join(lines)
    m = re.search(r"curl (\S+) \\\n\s+(.*?) \\\n\s+-d '(.*)'\n", text)
    if m is None:
        return None
    headers = dict(h.split(": ", 1) for h in re.findall(r"-H '([^']*)'", m.group(2)))
    return m.group(1), headers, json.loads(m.group(3))


def _redis_port(proc: Proc) -> int:
    found = re.findall(r"embedded Redis at redis://[^:]+:(\d+)", "".join(proc.lines))
    port = int(found[0])
    assert _accepts(port)
    return port


def _stop_cleanly(proc: Proc, how: str, redis_port: int) -> None:
    """Ctrl-C signals the whole process group (the embedded server too); SIGTERM, e.g. from a
    service manager, only the process. Either way the loops stop before the server does:
    exit 0, no traceback, the embedded Redis gone."""
    if how == "ctrl-c":
        os.killpg(proc.popen.pid, signal.SIGINT)
    else:
        proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(30) == 0
    proc._reader.join(5)
    output = "".join(proc.lines)
    assert "Traceback" not in output, output
    assert "Application shutdown complete" in output
    assert not _accepts(redis_port), "embedded Redis left running"


def test_printed_curl_works_at_once_and_ctrl_c_stops_cleanly(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    """One server for both (each start costs ~10 s of CI): the curl, the console and the
    derived target, then Ctrl-C after the outputs have flowed."""
    with _serve(tiny_model_dir, tmp_path, *TINY) as proc:
        proc.wait_for(lambda: _curl_request(list(proc.lines)) is not None)
        found = _curl_request(list(proc.lines))
        assert found is not None
        url, headers, body = found
        # run right away, as a reader copying the line would: no retry
        resp = httpx.post(url, headers=headers, json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert "Admin key (shown once): cp-admin-" in "".join(proc.lines)
        # the printed console URL opens the sign-in page; the printed admin key reads its stats
        proc.wait_for(lambda: "Console: " in "".join(proc.lines))
        text = "".join(proc.lines)
        console = re.search(r"Console: (\S+/console) ", text)
        admin = re.search(r"Admin key \(shown once\): (\S+)", text)
        assert console is not None and admin is not None
        page = httpx.get(console.group(1), timeout=10)
        assert page.status_code == 200 and 'id="login-form"' in page.text
        stats = httpx.get(console.group(1).replace("/console", "/admin/stats"), timeout=10,
                          headers={"Authorization": f"Bearer {admin.group(1)}"})
        assert stats.status_code == 200 and "doctor" in stats.json()
        # once the step-cost model has seen enough steps, serve says what TPOT target it chose
        more = httpx.post(url, headers=headers, timeout=60, json={
            **body, "max_tokens": 40, "ignore_eos": True})
        assert more.status_code == 200, more.text
        proc.wait_for(lambda: "interactive TPOT target" in "".join(proc.lines), timeout=30)
        line = re.search(r"INFO: +interactive TPOT target (\d+) ms \(derived", "".join(proc.lines))
        assert line is not None  # a number of ms, derived from the measured step cost
        # outputs flowed (a stream too): the worker's, the output reader's and the cancel
        # loops are all busy when Ctrl-C comes
        assert httpx.post(url, headers=headers, json={**body, "stream": True},
                          timeout=60).status_code == 200
        _stop_cleanly(proc, "ctrl-c", _redis_port(proc))


def test_sigterm_stops_cleanly(tiny_model_dir: Path, tmp_path: Path) -> None:
    with _serve(tiny_model_dir, tmp_path, *TINY) as proc:
        proc.wait_for(lambda: _ready(proc.url))
        redis_port = _redis_port(proc)
        request = _curl_request(list(proc.lines))
        assert request is not None
        url, headers, body = request
        assert httpx.post(url, headers=headers, json={**body, "stream": True},
                          timeout=60).status_code == 200
        _stop_cleanly(proc, "sigterm", redis_port)


def test_sigterm_ends_a_stream_in_flight_cleanly(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A stream that would run for ~20 s when SIGTERM comes: the process exits 0 within the
    graceful period, prints no traceback, and the client's stream ends with the shutdown
    error event and ``[DONE]`` (not a cut connection)."""
    # echo engine, 20 ms a step: 1000 tokens (the demo tenant's cap is 1024) last 20 s
    with _serve(tiny_model_dir, tmp_path, "--engine", "echo", "--echo-step-ms", "20",
                "--drain-timeout", "5") as proc:
        proc.wait_for(lambda: _curl_request(list(proc.lines)) is not None)
        redis_port = int(re.findall(r"embedded Redis at redis://[^:]+:(\d+)",
                                    "".join(proc.lines))[0])
        request = _curl_request(list(proc.lines))
        assert request is not None
        url, headers, body = request
        events: list[str] = []
        with httpx.stream("POST", url, headers=headers, timeout=30,
                          json={**body, "stream": True, "max_tokens": 1000}) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for line in lines:  # a few tokens first: the request runs in the engine
                events += [line] if line else []
                if len(events) >= 5:
                    break
            proc.popen.send_signal(signal.SIGTERM)
            sent_at = time.monotonic()
            events += [line for line in lines if line]  # raises if the connection is cut
        assert time.monotonic() - sent_at < 10, "the stream outlived the graceful period"
        assert proc.popen.wait(10) == 0
        proc._reader.join(5)
    output = "".join(proc.lines)
    assert "Traceback" not in output, output
    assert "Exception in ASGI application" not in output, output
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["error"]["code"] == "server_shutdown", events[-3:]
    # what came before is an unfinished completion: the shutdown ended it, not the engine
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert len(chunks) >= 5 and all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert not _accepts(redis_port), "embedded Redis left running"
