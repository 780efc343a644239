"""Kernel-test fixtures. TRITON_INTERPRET=1 is set by tests/conftest.py before triton loads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def force_triton(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Route the public kernels functions to the Triton path (run by the interpreter)."""
    monkeypatch.setenv("CARPOOL_FORCE_TRITON", "1")
    yield
