"""Suite-wide set-up. TRITON_INTERPRET must be set before any Triton kernel module is imported,
so that forced-Triton tests can run the kernels on CPU; it changes nothing for the torch paths."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
