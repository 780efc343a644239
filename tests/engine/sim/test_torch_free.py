"""engine.sim and the simulate/plan commands import without torch (a fresh interpreter where
torch cannot be imported runs `carpool simulate seed000`)."""

from __future__ import annotations

from tests.torch_blocker import run_without_torch

SCRIPT = """
    import importlib, pkgutil, sys

    import engine.sim
    names = [m.name for m in pkgutil.walk_packages(engine.sim.__path__, "engine.sim.")]
    for name in names + ["gateway.cli.simulate", "gateway.cli.plan", "gateway.cli.plan_report"]:
        importlib.import_module(name)
    from gateway.cli.main import main
    assert main(["simulate", "seed000"]) == 0
    assert "torch" not in sys.modules, "torch was imported"
"""


def test_engine_sim_is_torch_free() -> None:
    proc = run_without_torch(SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert "250.0 s" in proc.stdout
