"""`.ci/uv_install.py`: what this machine's pip is told (its config files and PIP_* variables,
as `pip config list` prints them) reaches uv as flags, by pip's precedence; a pin outside
one of pip's constraints is refused before uv runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("uv_install", REPO / ".ci" / "uv_install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


uv_install = _module()

LISTED = """\
:env:.find-links='/opt/wheels'
:env:.default-timeout='180'
global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/elsewhere'
global.index-url='https://mirror.example/simple'
install.index-url='https://closer.example/simple'
site.something='ignored: not a scope pip has'
"""


def test_settings_follow_pips_precedence() -> None:
    settings = uv_install.pip_settings(LISTED)
    assert settings["find-links"] == "/opt/wheels"  # a variable wins over a file
    assert settings["index-url"] == "https://closer.example/simple"  # [install] over [global]
    assert settings["extra-index-url"] == "file:///opt/a/simple file:///opt/b/simple"
    assert "something" not in settings


def test_each_setting_becomes_its_uv_flag_or_variable() -> None:
    args, env = uv_install.uv_args(uv_install.pip_settings(LISTED))
    assert args == ["--extra-index-url", "file:///opt/a/simple",
                    "--extra-index-url", "file:///opt/b/simple",
                    "--find-links", "/opt/wheels", "--index-url", "https://closer.example/simple"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt", "UV_HTTP_TIMEOUT": "180"}
    assert uv_install.uv_args({"no-index": "true"}) == (["--no-index"], {})


def test_a_pin_outside_a_constraint_is_named() -> None:
    pins = {"torch": "2.13.0+cpu", "numpy": "2.3.0"}
    assert uv_install.outside_constraints(pins, ["# cap", "torch<=2.14.1", "", "scipy<1"]) == []
    assert uv_install.outside_constraints(pins, ["Torch<2.13"]) == [
        "Torch==2.13.0+cpu is outside the constraint Torch<2.13"]


def test_a_lock_that_breaks_a_constraint_stops_before_uv(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("torch<2.13\n")
    python = tmp_path / "python"  # answers `-m pip config list` with the constraint file
    python.write_text(f"#!/bin/sh\necho \"global.constraint='{tmp_path / 'c.txt'}'\"\n")
    python.chmod(0o755)
    uv = tmp_path / "uv"  # would leave a mark if it were run
    uv.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\n")
    uv.chmod(0o755)
    proc = subprocess.run([sys.executable, str(REPO / ".ci" / "uv_install.py"), str(uv),
                           str(python), "--no-deps", "-r", str(REPO / "requirements" / "serve.lock")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "torch==2.13.0+cpu is outside the constraint torch<2.13" in proc.stderr
    assert not (tmp_path / "ran").exists()
