"""Fail when this Python's installed distributions disagree with the locks.

    python .ci/lock_check.py LOCK [LOCK ...]

Every ``name==version`` line of the locks must be installed at exactly that version, and
nothing else may be installed, except pip (the venv's own) and Carpool itself (editable).
Prints one line per difference and the fix, and exits 1; prints one line and exits 0 when
the venv is the locks. `make test` runs it before the suite, so CI sees drift first.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

ALLOWED_EXTRA = {"pip", "carpool"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


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


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    pins = read_locks([Path(a) for a in argv])
    if not pins:
        print(f"lock check: no pins found in {' '.join(argv)}", file=sys.stderr)
        return 2
    lines = differences(pins, installed())
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
