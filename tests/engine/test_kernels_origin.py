"""The ``kernels`` name clash (PyPI's ``kernels``, pulled in by transformers 5.25, against
Carpool's kernels/): every entry point imports Carpool's own, and a foreign one first on the
path, or installed at all, stops Carpool at start with one line naming the file and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kernels
from engine.kernels_origin import OWN_KERNELS, foreign_kernels

REPO = Path(__file__).resolve().parents[2]
CARPOOL = Path(sys.executable).parent / "carpool"  # the installed console script


def _fake_package(root: Path) -> Path:
    """A foreign importable ``kernels``: a package whose import would leave a mark."""
    pkg = root / "kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('foreign kernels imported')\n")
    return pkg / "__init__.py"


def _fake_distribution(root: Path) -> Path:
    """An installed distribution named ``kernels`` (metadata only, as pip leaves it)."""
    info = root / "kernels-0.19.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.19.1\n")
    return info


def _run(args: list[str], pythonpath: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def _assert_one_line_refusal(proc: subprocess.CompletedProcess[str], *names: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for name in names:
        assert name in lines[0], lines[0]
    assert "fix: pip uninstall -y kernels" in lines[0]


def test_pytest_imports_carpools_own_kernels() -> None:
    assert Path(kernels.__file__).resolve() == OWN_KERNELS
    assert OWN_KERNELS == REPO / "kernels" / "__init__.py"
    assert foreign_kernels() is None


def test_installed_entry_point_starts_with_no_foreign_kernels(tmp_path: Path) -> None:
    proc = _run([str(CARPOOL), "--help"], None, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "serve" in proc.stdout


def test_entry_point_refuses_a_foreign_package_first_on_the_path(tmp_path: Path) -> None:
    fake = _fake_package(tmp_path / "site")
    proc = _run([str(CARPOOL), "--help"], tmp_path / "site", tmp_path)
    _assert_one_line_refusal(proc, str(fake), "comes first on sys.path", str(OWN_KERNELS))
    assert "foreign kernels imported" not in proc.stderr  # found by looking, never imported


def test_python_m_from_the_repo_finds_ours_first(tmp_path: Path) -> None:
    """``python -m`` puts the working directory first: from the repo, ours wins over the
    foreign package on PYTHONPATH; from elsewhere, the foreign one wins and is refused."""
    _fake_package(tmp_path / "site")
    args = [sys.executable, "-m", "gateway.cli.main", "--help"]
    assert _run(args, tmp_path / "site", REPO).returncode == 0
    _assert_one_line_refusal(_run(args, tmp_path / "site", tmp_path), "comes first on sys.path")


def test_an_installed_foreign_distribution_is_refused(tmp_path: Path) -> None:
    """With ours first (pytest, python -m from the repo) the clash would break transformers:
    the installed distribution alone is enough to refuse."""
    info = _fake_distribution(tmp_path / "site")
    proc = _run([str(CARPOOL), "--help"], tmp_path / "site", tmp_path)
    _assert_one_line_refusal(proc, "'kernels' 0.19.1", str(info.parent), "transformers>=5.25")


def test_pytest_stops_with_the_same_line(tmp_path: Path) -> None:
    _fake_distribution(tmp_path / "site")
    proc = _run([sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider",
                 "tests/policies"], tmp_path / "site", REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the distribution 'kernels' 0.19.1 is installed" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
