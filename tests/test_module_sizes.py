"""No module a reader cannot hold: at most 450 lines a file and 70 a function, outside tests
(docs/architecture.md). Split along what the code does, not by cutting a file in half."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("kernels", "policies", "engine", "gateway", "loadtests", ".ci")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 70


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def test_no_module_past_its_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"past {MAX_FILE_LINES} lines: {long}"


def test_no_function_past_its_limit() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"past {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
