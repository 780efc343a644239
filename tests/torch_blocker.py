"""Run a Python snippet in a fresh interpreter where torch cannot be imported (the torch-free
tests of engine.core, engine.sim and the gateway's model info share it).

torch stays installed and findable (libraries that probe for it decide as in production), but
importing it fails: the loader of its spec raises ``ImportError("torch is blocked here ...")``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BLOCKER = textwrap.dedent("""
    import importlib.abc, importlib.machinery, importlib.util, sys

    class Refuse(importlib.abc.Loader):
        def create_module(self, spec):
            raise ImportError(f"torch is blocked here ({spec.name})")
        def exec_module(self, module):
            raise ImportError("unreachable")

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                return importlib.machinery.ModuleSpec(name, Refuse())
            return None

    sys.meta_path.insert(0, NoTorch())
    assert importlib.util.find_spec("torch") is not None
""")


def run_without_torch(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` (dedented) run from the repository root with torch blocked; ``args`` become
    its ``sys.argv[1:]``."""
    return subprocess.run([sys.executable, "-c", _BLOCKER + textwrap.dedent(script), *args],
                          cwd=ROOT, capture_output=True, check=False, text=True, timeout=120)
