"""Fault tests: each scenario adds one row (``FaultRow``) to a table printed at the end of
the run (requests, completed, clear errors, 5xx, recovery time, KV blocks after idle; the
printing hooks are in tests/conftest.py, which pytest-xdist's controller loads)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.faults.cluster import Cluster, cluster
from tests.gateway.faults.table import ROWS


@pytest.fixture(scope="session")
def fault_rows() -> list[Any]:
    return ROWS


@pytest.fixture(scope="package")
def real_cluster(redis_url: str, tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A gateway and two tiny-real-engine workers, shared by the worker kill and drain tests
    (tests/gateway/faults/cluster.py)."""
    with cluster(redis_url, tiny_model_dir, tmp_path_factory.mktemp("cluster")) as running:
        yield running
