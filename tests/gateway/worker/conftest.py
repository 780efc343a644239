"""Fixtures for the worker's tests that build a backlog with the drainer held."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.harness import make_config, run_gateway
from tests.gateway.worker.drainer_hold import HeldWorker


@pytest.fixture(scope="module")
def backlog_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """The echo stack (2 ms steps, drainer can be held) with a request deadline that outlasts
    a held backlog. With the drainer held a tier starts nothing, so its predicted wait is the
    depth times the status window (10 s): at the harness's 60 s deadline, early shedding
    answered 503 to every request sent once a worker's status had published a depth of 7
    or more, a race a slow machine loses."""
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0,
                         request_timeout_s=3600.0)
    with run_gateway(config, redis_url, worker_type=HeldWorker) as gw:
        yield gw
