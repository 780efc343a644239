"""Gateway fixtures (the session's embedded Redis, ``redis_url``, is in tests/conftest.py;
each test namespaces its keys)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def tiny_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """The whole stack in one process: uvicorn + gateway + worker + the real AsyncEngine on
    the tiny random Llama (64 KV blocks of 16 tokens, so leaks show up). Its worker's drainer
    can be held (``tests/gateway/worker/drainer_hold.py``)."""
    from tests.gateway.harness import make_config, run_gateway
    from tests.gateway.worker.drainer_hold import HeldWorker

    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=TINY_ENGINE)
    with run_gateway(config, redis_url, worker_type=HeldWorker) as gw:
        yield gw


TINY_ENGINE = {"num_blocks": 64, "block_size": 16, "max_num_seqs": 16, "max_model_len": 512}


@pytest.fixture(scope="module")
def echo_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """The stack with the FAKE echo engine (2 ms per step): for gateway-only mechanics
    (quotas, queues, WRR) where a model would only add time. Its drainer can be held."""
    from tests.gateway.harness import make_config, run_gateway
    from tests.gateway.worker.drainer_hold import HeldWorker

    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0)
    with run_gateway(config, redis_url, worker_type=HeldWorker) as gw:
        yield gw
