"""Fault tests: each scenario adds one row (``FaultRow``) to a table printed at the end of
the run (requests, completed, clear errors, 5xx, recovery time, KV blocks after idle)."""

from __future__ import annotations

from typing import Any

import pytest

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
