"""Gateway fixtures: one embedded Redis for the session; each test namespaces its keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.redis_server import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = EmbeddedRedis()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()
