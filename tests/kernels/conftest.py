"""Fixtures shared by the kernel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def threads() -> Iterator[None]:
    """Lets a test set torch's thread count; the count before it is restored after."""
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)
