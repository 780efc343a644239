"""Fixtures of the bus tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def own_url() -> Iterator[str]:
    """A fresh embedded server for the module alone: tests that count ``INFO commandstats``
    must see no other module's commands."""
    from gateway.bus.embedded import EmbeddedRedis

    server = EmbeddedRedis()
    try:
        yield server.start()
    finally:
        server.stop()
