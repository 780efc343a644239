"""engine.sim and the simulate/plan commands import without torch (a fresh interpreter where
torch cannot be imported runs `carpool simulate seed000`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import importlib, importlib.abc, pkgutil, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked here ({name})")
            return None

    sys.meta_path.insert(0, NoTorch())

    import engine.sim
    names = [m.name for m in pkgutil.walk_packages(engine.sim.__path__, "engine.sim.")]
    for name in names + ["gateway.cli.simulate", "gateway.cli.plan", "gateway.cli.plan_report"]:
        importlib.import_module(name)
    from gateway.cli.main import main
    assert main(["simulate", "seed000"]) == 0
    assert "torch" not in sys.modules, "torch was imported"
""")


def test_engine_sim_is_torch_free() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "250.0 s" in proc.stdout
