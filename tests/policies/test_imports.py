"""policies/ imports nothing from engine/: a fresh interpreter imports every policies module
and no module named engine (or engine.*) gets loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import importlib, pkgutil, sys

    import policies
    names = [m.name for m in pkgutil.walk_packages(policies.__path__, "policies.")]
    for name in names:
        importlib.import_module(name)
    loaded = sorted(m for m in sys.modules if m == "engine" or m.startswith("engine."))
    print("imported", len(names))
    print("engine modules:", loaded)
""")


def test_policies_import_nothing_from_engine() -> None:
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, check=False,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    modules = [p for p in (ROOT / "policies").glob("*.py") if p.name != "__init__.py"]
    assert f"imported {len(modules)}" in res.stdout
    assert "engine modules: []" in res.stdout
