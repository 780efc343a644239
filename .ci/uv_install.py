"""Install locks into a venv with uv, from the places pip would fetch them.

    python .ci/uv_install.py UV PYTHON PIP_INSTALL_ARGS...

Runs ``UV pip install --python PYTHON --index-strategy unsafe-best-match PIP_INSTALL_ARGS``
plus the index settings of this machine's pip (``pip config list``: its config files and
``PIP_*`` variables, a variable winning over a file, an ``[install]`` setting over a
``[global]`` one). uv reads neither pip's files nor its variables; without them it would miss
the local wheel folder that holds torch's CPU build, or an index a firewall allows.
``unsafe-best-match`` is pip's own rule: a pin is taken from whichever index has it (uv's
default takes the first index that knows the name, at any version). pip's constraints (e.g. a
machine's cap on torch) are checked here against the pins of the ``-r`` files: uv refuses an
unpinned constraint under ``--require-hashes``, and on exact pins a constraint can only refuse.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

# pip setting -> uv flag; each whitespace-separated value gets its own flag
LIST_FLAGS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
              "trusted-host": "--allow-insecure-host"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)
SCOPES = ("global", "install", ":env:")  # later wins, as in pip


def pip_settings(config_list: str) -> dict[str, str]:
    """``pip config list`` lines (``scope.key='value'``) -> key -> value, by pip's precedence."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in config_list.splitlines():
        scoped, sep, raw = line.partition("=")
        scope, dot, key = scoped.rpartition(".")
        if not (sep and dot) or scope not in SCOPES:
            continue
        rank = SCOPES.index(scope)
        value = " ".join(str(ast.literal_eval(raw)).split())  # pip prints repr()
        if key not in ranked or ranked[key][0] <= rank:
            ranked[key] = (rank, value)
    return {key: value for key, (_, value) in ranked.items()}


def uv_args(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The uv flags and environment that say what ``settings`` say to pip."""
    args: list[str] = []
    env: dict[str, str] = {}
    for key, flag in LIST_FLAGS.items():
        for value in settings.get(key, "").split():
            args += [flag, value]
    if settings.get("index-url"):
        args += ["--index-url", settings["index-url"]]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("default-timeout") or settings.get("timeout"):
        env["UV_HTTP_TIMEOUT"] = settings.get("timeout") or settings["default-timeout"]
    return args, env


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def outside_constraints(pins: dict[str, str], constraints: list[str]) -> list[str]:
    """The pins (name -> version) that a constraint line (``torch<=2.14.1``) excludes."""
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

    bad = []
    for line in constraints:
        try:
            req = Requirement(line.split("#")[0].strip())
        except InvalidRequirement:
            continue  # blank, a comment, an option line
        version = pins.get(_normal(req.name))
        if version is not None and not req.specifier.contains(version, prereleases=True):
            bad.append(f"{req.name}=={version} is outside the constraint {req}")
    return bad


def _pins(args: list[str]) -> dict[str, str]:
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-r", "--requirement")]
    return {_normal(m.group(1)): m.group(2)
            for f in files for m in PIN.finditer(Path(f).read_text())}


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    uv, python, *rest = argv
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=True).stdout
    settings = pip_settings(listed)
    args, env = uv_args(settings)
    constraints = [line for f in settings.get("constraint", "").split()
                   for line in Path(f).read_text().splitlines()]
    bad = outside_constraints(_pins(rest), constraints)
    if bad:
        print("\n".join(["uv_install: the lock breaks pip's constraints:", *bad]),
              file=sys.stderr)
        return 1
    cmd = [uv, "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match",
           *args, *rest]
    return subprocess.run(cmd, env={**os.environ, **env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
