"""Suite-wide set-up. TRITON_INTERPRET must be set before any Triton kernel module is imported,
so that forced-Triton tests can run the kernels on CPU; it changes nothing for the torch paths."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# Servers, Redis and engines share 2 cores in these tests: no OpenMP busy-waiting (see
# gateway/cli/main.py). Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# pytest puts the repo first on sys.path, so Carpool's kernels/ is found; a foreign `kernels`
# installed beside it would then break transformers (the tests' reference) instead. engine's
# import refuses either case in one line: stop the run with that line.
# pytest.exit here would be reported as a conftest import failure (exit 4, with its frame):
# the one line and exit 2 come from SystemExit, which pytest lets through.
try:
    import engine  # noqa: F401
except ImportError as _exc:
    if _exc.name != "kernels":
        raise
    print(_exc, file=sys.stderr)
    raise SystemExit(2) from None


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct converted to safetensors in the default cache
    (~/.cache/carpool): converted once (~20 s), then reused by every later run."""
    from tests.model_factories import smollm2_dir as _smollm2_dir

    return _smollm2_dir()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A random 2-layer Llama (hidden 64, 4 heads, 2 KV heads) with the SmolLM2 tokenizer."""
    from tests.model_factories import make_tiny_llama_dir

    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny_llama"), tokenizer_dir=smollm2_dir)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """One embedded Redis server for the whole run; tests namespace their keys."""
    from gateway.bus.embedded import EmbeddedRedis

    server = EmbeddedRedis()
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


# The fault scenarios' tables (tests/gateway/faults/table.py), printed at the end of the run.
# Under pytest-xdist the rows are filled in the workers and printed by the controller, which
# loads this file but not the conftest of a folder it does not collect.
def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        from tests.gateway.faults import table

        output.update(table.export())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    from tests.gateway.faults import table

    table.absorb(getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.gateway.faults import table

    for line in table.summary_lines():
        terminalreporter.write_line(line)
