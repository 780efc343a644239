"""Fault tests: each scenario adds one row (``FaultRow``) to a table printed at the end of
the run (requests, completed, clear errors, 5xx, recovery time, KV blocks after idle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.faults.cluster import Cluster, cluster
from tests.gateway.faults.table import LEDGER_ROWS, ROWS, render, render_ledger


@pytest.fixture(scope="session")
def fault_rows() -> list[Any]:
    return ROWS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if ROWS:
        terminalreporter.write_line("")
        terminalreporter.write_line("fault scenarios:")
        for line in render(ROWS):
            terminalreporter.write_line(line)
    if LEDGER_ROWS:
        terminalreporter.write_line("")
        terminalreporter.write_line("ledger check (completion tokens):")
        for line in render_ledger(LEDGER_ROWS):
            terminalreporter.write_line(line)


@pytest.fixture(scope="package")
def real_cluster(redis_url: str, tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A gateway and two tiny-real-engine workers, shared by the worker kill and drain tests
    (tests/gateway/faults/cluster.py)."""
    with cluster(redis_url, tiny_model_dir, tmp_path_factory.mktemp("cluster")) as running:
        yield running
