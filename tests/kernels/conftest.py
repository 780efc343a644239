"""Kernel-test fixtures. TRITON_INTERPRET=1 is set by tests/conftest.py before triton loads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernels import set_use_triton


@pytest.fixture
def force_triton() -> Iterator[None]:
    """Route the public kernels functions to the Triton path (run by the interpreter)."""
    set_use_triton(True)
    yield
    set_use_triton(None)
