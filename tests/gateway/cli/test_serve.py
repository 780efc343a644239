"""`carpool serve` with the embedded Redis: SIGTERM stops the server it started."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.harness import free_port
from tests.gateway.procs import REPO, Proc, _ready

pytestmark = pytest.mark.timeout(120)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_stops_the_embedded_redis(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(CARPOOL_STATE_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    popen = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--engine", "echo", "--no-demo",
         "--model", str(tiny_model_dir), "--port", str(port)],
        cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    proc = Proc(popen, port)
    try:
        proc.wait_for(lambda: _ready(proc.url))
        found = [m for ln in proc.lines if (m := re.search(r"embedded Redis at redis://[^:]+:(\d+)", ln))]
        redis_port = int(found[0].group(1))
        assert _accepts(redis_port)
        popen.send_signal(signal.SIGTERM)
        assert popen.wait(30) == 0
        assert not _accepts(redis_port), "embedded Redis left running after SIGTERM"
    finally:
        if popen.poll() is None:
            popen.kill()
