"""kernels.cpu_ext: ``make setup``'s build step compiles only what is not built yet (a fresh
clone's new venv finds this machine's builds), and the build folder's key changes with the
source."""

from __future__ import annotations

import pytest

from kernels import cpu_small_linear
from kernels.cpu_ext import CppOps


def test_a_built_op_is_found_not_compiled_again(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ops = cpu_small_linear.OPS
    if not ops.available():
        pytest.skip("small-batch linear op not built (make setup)")
    built: list[str] = []
    monkeypatch.setattr(CppOps, "build", lambda self, verbose=False: built.append(self.name))
    ops.main("test")
    assert built == [] and "found built in" in capsys.readouterr().out


def test_an_op_never_built_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = CppOps("carpool_test_never_built", "// a source no build folder holds\n", ("f",))
    assert ops.module() is None
    built: list[str] = []
    monkeypatch.setattr(CppOps, "build", lambda self, verbose=False: built.append(self.name))
    ops.main("test")
    assert built == ["carpool_test_never_built"]
    other = CppOps("carpool_test_never_built", "// another source\n", ("f",))
    assert other.build_dir() != ops.build_dir()
