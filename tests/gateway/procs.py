"""Run ``carpool serve --role ...`` as real OS processes sharing one Redis (multi-process tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.harness import SECRET, free_port

REPO = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, popen: subprocess.Popen[str], port: int | None) -> None:
        self.popen, self.port = popen, port
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    def wait_for(self, predicate: Any, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.popen.poll() is not None:
                raise RuntimeError("process exited:\n" + "".join(self.lines[-40:]))
            if time.monotonic() > deadline:
                raise TimeoutError("process not ready:\n" + "".join(self.lines[-40:]))
            time.sleep(0.1)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start(role: str, redis_url: str, namespace: str, model_dir: Path, tmp: Path,
          *extra: str, env: dict[str, str] | None = None) -> Proc:
    """Start ``carpool serve --role role`` without waiting for it (``ready``, ``stop``)."""
    port = free_port() if role != "worker" else None
    args = [sys.executable, "-m", "gateway.cli.main", "serve", "--role", role, "--engine", "echo",
            "--model", str(model_dir), "--no-demo", *extra]
    if port is not None:
        args += ["--port", str(port)]
    full_env = {**os.environ, "REDIS_URL": redis_url, "CARPOOL_NAMESPACE": namespace,
                "CARPOOL_SECRET": SECRET.decode(), "CARPOOL_STATE_DIR": str(tmp),
                "CARPOOL_VISIBILITY_TIMEOUT_S": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    popen = subprocess.Popen(args, cwd=str(REPO), env=full_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    return Proc(popen, port)


def ready(proc: Proc) -> None:
    """Wait until a worker says it is ready, or a gateway's /readyz answers 200."""
    if proc.port is None:
        proc.wait_for(lambda: any("ready" in ln for ln in proc.lines))
    else:
        proc.wait_for(lambda: _ready(proc.url))


def stop(proc: Proc) -> None:
    popen = proc.popen
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)


@contextmanager
def spawn(role: str, redis_url: str, namespace: str, model_dir: Path, tmp: Path,
          *extra: str, env: dict[str, str] | None = None) -> Iterator[Proc]:
    proc = start(role, redis_url, namespace, model_dir, tmp, *extra, env=env)
    try:
        ready(proc)
        yield proc
    finally:
        stop(proc)


@contextmanager
def spawn_all(redis_url: str, namespace: str, model_dir: Path, tmp: Path,
              *roles: tuple[str, list[str]], env: dict[str, str] | None = None
              ) -> Iterator[list[Proc]]:
    """``spawn`` for several processes (``(role, extra args)`` each), started all at once
    rather than each after the last is ready (their start-up is mostly imports and the model:
    on 2 cores, about half the time); stopped in the reverse order, workers before gateway."""
    procs: list[Proc] = []
    try:
        for role, extra in roles:
            procs.append(start(role, redis_url, namespace, model_dir, tmp, *extra, env=env))
        for proc in procs:
            ready(proc)
        yield procs
    finally:
        for proc in reversed(procs):
            stop(proc)
