"""engine.core and engine.protocol import without torch: a fresh interpreter where torch
cannot be imported loads every one of those modules, and torch never shows up."""

from __future__ import annotations

from tests.torch_blocker import ROOT, run_without_torch

SCRIPT = """
    import importlib, pkgutil, sys

    import engine.core
    names = [m.name for m in pkgutil.walk_packages(engine.core.__path__, "engine.core.")]
    for name in names + ["engine.protocol"]:
        importlib.import_module(name)
    assert "torch" not in sys.modules, "torch was imported"
    print("imported", len(names) + 1)
    try:  # the blocker works: the runner needs torch
        import engine.runner.model_runner
    except ImportError as exc:
        print("blocked:", exc)
    else:
        raise AssertionError("engine.runner.model_runner imported without torch")
"""


def test_engine_core_and_protocol_import_without_torch() -> None:
    res = run_without_torch(SCRIPT)
    assert res.returncode == 0, res.stderr
    count = int(res.stdout.split("imported ")[1].split()[0])
    modules = [p for p in (ROOT / "engine" / "core").glob("*.py") if p.name != "__init__.py"]
    assert count == len(modules) + 1  # every module of engine.core, and engine.protocol
    assert "blocked: torch is blocked here" in res.stdout
