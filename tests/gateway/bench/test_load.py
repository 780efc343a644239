"""``bench/load.py``'s server pids for the pinned rows: the gateway process as given, and the
Redis server's own pid (read through the sync client of ``bus/client.py``), checked against
the process listening on that port per ``/proc``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from gateway.bench.load import server_pids


def test_server_pids_names_the_gateway_and_the_redis_server(redis_url: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        gateway_pid, redis_pid = server_pids(proc, redis_url)
    finally:
        proc.kill()
        proc.wait()
    assert gateway_pid == proc.pid
    cmdline = Path(f"/proc/{redis_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert f":{urlparse(redis_url).port}" in cmdline, cmdline  # the server on that port
