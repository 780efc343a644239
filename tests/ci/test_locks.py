"""The committed locks (requirements/*.lock) and the drift check that `make test` runs first
(.ci/lock_check.py): exact pins with hashes, the CPU build of torch and no CUDA packages, a
serve lock that agrees with the dev lock, bounded ranges in pyproject.toml, and a check that
names every difference between a venv and its lock."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "requirements"
CHECK = REPO / ".ci" / "lock_check.py"
BLOCK = re.compile(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+)",
                   re.MULTILINE)


def _pins(name: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, hashes) of one lock, every pin required to carry its hashes."""
    text = (LOCKS / name).read_text()
    pins = {m.group(1): (m.group(2), frozenset(re.findall(r"sha256:([0-9a-f]{64})", m.group(3))))
            for m in BLOCK.finditer(text)}
    assert len(pins) == len(re.findall(r"^\S+==", text, re.MULTILINE)), f"{name}: a pin without a hash"
    return pins


def _check(*locks: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *map(str, locks)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_torch_is_the_cpu_build_and_no_cuda_package_is_locked() -> None:
    for lock in ("serve.lock", "dev.lock"):
        pins = _pins(lock)
        assert pins["torch"][0] == "2.13.0+cpu"
        cuda = [n for n in pins if n.startswith(("nvidia-", "cuda-")) or n == "kernels"]
        assert cuda == [], f"{lock}: {cuda}"


def test_the_venv_installed_from_the_lock_holds_no_cuda_package() -> None:
    names = {(d.metadata["Name"] or "").lower() for d in metadata.distributions()}
    assert not [n for n in names if n.startswith(("nvidia-", "cuda-"))]
    assert metadata.version("torch") == "2.13.0+cpu"


def test_transformers_stays_below_the_kernels_clash() -> None:
    version = _pins("dev.lock")["transformers"][0]
    assert tuple(int(p) for p in version.split(".")[:2]) < (5, 25)


def test_serve_lock_agrees_with_the_dev_lock() -> None:
    serve, dev = _pins("serve.lock"), _pins("dev.lock")
    assert set(serve) < set(dev)
    assert {n: serve[n] for n in serve} == {n: dev[n] for n in serve}
    for test_only in ("pytest", "playwright", "locust", "mypy"):
        assert test_only in dev and test_only not in serve


def test_pyproject_ranges_are_bounded_and_admit_the_lock() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins("dev.lock")
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    for req in reqs:
        ops = {spec.operator for spec in req.specifier}
        assert ops & {"<", "<=", "=="}, f"{req}: a range without an upper bound"
        if req.marker is None or req.marker.evaluate():
            version = pins[req.name.lower()][0]
            assert req.specifier.contains(version, prereleases=True), (str(req), version)


def test_the_venv_is_the_lock() -> None:
    proc = _check(LOCKS / "dev.lock", "--alone", LOCKS / "model.lock")
    assert proc.returncode == 0, proc.stderr
    assert "the venv is the lock" in proc.stdout


def test_drift_is_named_line_by_line(tmp_path: Path) -> None:
    """A stale pin, a package the lock lacks and one the venv lacks: each gets its line."""
    text = (LOCKS / "dev.lock").read_text()
    torch = re.search(r"^torch==\S+", text, re.MULTILINE)
    assert torch is not None
    text = text.replace(torch.group(0), "torch==2.12.0")
    text = re.sub(r"^pytest==.*\n(\s+--hash.*\n)+", "", text, flags=re.MULTILINE)
    text += "left-pad==1.0.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    stale = tmp_path / "dev.lock"
    stale.write_text(text)
    proc = _check(stale, "--alone", LOCKS / "model.lock")
    assert proc.returncode == 1
    assert "wrong version: torch 2.13.0+cpu installed, the lock has 2.12.0" in proc.stderr
    assert "not in the lock: pytest" in proc.stderr
    assert "missing: left-pad==1.0.0" in proc.stderr
    assert "fix: rm -rf .venv && make test" in proc.stderr


def test_a_lock_with_no_pins_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.lock"
    empty.write_text("# nothing\n")
    proc = _check(empty)
    assert proc.returncode == 2 and "no pins found" in proc.stderr
