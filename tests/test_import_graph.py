"""The import graph against docs/architecture.md: no circle between modules, no import against
the layer order, no bench module on the serving path, ``loadtests/`` reached from the gateway
only through its one door. Read with ``ast`` (nothing is imported).

An edge is every ``import`` of a module of ours, at module level or inside a function (a lazy
import is still a dependency), and under ``if TYPE_CHECKING:`` too (a type-only import is a
dependency of the code; the circles such imports hid were real ones). ``from a import b`` is
an edge to ``a.b`` when that is a module, else to ``a``. Importing ``a.b.c`` runs ``a`` and
``a.b``'s ``__init__`` too; those implicit edges are not counted (every module of a package
would then be in a circle with an ``__init__`` that imports one of them).

The rules come from the doc's machine-readable tables (between the ``<!-- import-rules -->``
and ``<!-- import-doors -->`` markers), so the doc and this test cannot disagree.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("kernels", "policies", "engine", "gateway", "loadtests")
# What `carpool serve` runs (gateway + worker + engine) and the engine's own front ends: none of
# what they import, lazily or not, may be bench code or loadtests.
SERVING_ROOTS = ("gateway.cli.serve", "gateway.http.app", "gateway.worker.worker",
                 "engine.llm_engine", "engine.frontend.llm", "engine.frontend.async_engine")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool  # inside a function

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line}{', lazy' if self.lazy else ''})"


@dataclass(frozen=True)
class Rules:
    may_import: dict[str, tuple[str, ...]]  # module prefix -> prefixes it may import
    doors: dict[str, tuple[str, ...]]  # module -> prefixes it alone may import, lazily


# ---- the graph ------------------------------------------------------------------------------


def find_modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST,
             lazy: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, lazy
        else:
            inside = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(node, inside)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             modules: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in modules else base


def _ours(name: str, modules: dict[str, Path]) -> str | None:
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, list[Edge]]:
    modules = find_modules(root, packages)
    graph: dict[str, list[Edge]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, [])
        tree = ast.parse(path.read_text(), str(path))
        for node, lazy in _imports(tree):
            for name in _targets(node, module, path.name == "__init__.py", modules):
                target = _ours(name, modules)
                if target is not None and target != module:
                    edges.append(Edge(module, target, node.lineno, lazy))
    return graph


def cycles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start, start_edges in graph.items():
        if start in index:
            continue
        work = [(start, iter(start_edges))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for edge in edges:
                if edge.target not in index:
                    index[edge.target] = low[edge.target] = len(index)
                    stack.append(edge.target)
                    on_stack.add(edge.target)
                    work.append((edge.target, iter(graph.get(edge.target, []))))
                    break
                if edge.target in on_stack:
                    low[node] = min(low[node], index[edge.target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe_cycle(graph: dict[str, list[Edge]], component: list[str]) -> str:
    inside = set(component)
    edges = [str(e) for m in component for e in graph[m] if e.target in inside]
    return "circle: " + ", ".join(component) + "\n    " + "\n    ".join(sorted(set(edges)))


# ---- the rules ------------------------------------------------------------------------------


def _table(text: str, marker: str) -> list[list[str]]:
    m = re.search(rf"<!-- {marker} -->(.*?)<!-- /{marker} -->", text, re.DOTALL)
    assert m is not None, f"docs/architecture.md has no <!-- {marker} --> table"
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip().strip("`").strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and not set(cells[0]) <= set("-: ") and cells[0] != "module":
            rows.append(cells)
    assert rows, f"the {marker} table is empty"
    return rows


def _names(cell: str) -> tuple[str, ...]:
    return tuple(n.strip("` ") for n in cell.split(",") if n.strip("` ") not in ("", "nothing"))


def parse_rules(text: str) -> Rules:
    may_import = {row[0]: _names(row[1]) for row in _table(text, "import-rules")}
    doors = {row[0]: _names(row[1]) for row in _table(text, "import-doors")}
    return Rules(may_import, doors)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def is_bench(module: str) -> bool:
    return "bench" in module.split(".")


def _rule_for(module: str, rules: Rules) -> str | None:
    """The most specific row of the table that covers ``module``."""
    covering = [p for p in rules.may_import if _under(module, p)]
    return max(covering, key=len) if covering else None


def violations(graph: dict[str, list[Edge]], rules: Rules) -> list[str]:
    """Every edge against the layer table or the bench rule, unless its source is a door that
    imports the target lazily."""
    found = []
    for module, edges in graph.items():
        row = _rule_for(module, rules)
        if row is None:
            found.append(f"{module}: no row of the layer table covers it")
            continue
        for edge in edges:
            door = rules.doors.get(module, ())
            if edge.lazy and any(_under(edge.target, p) for p in door):
                continue
            allowed = (row, *rules.may_import[row])
            if not any(_under(edge.target, p) for p in allowed):
                what = ", ".join(allowed[1:]) or "nothing else"
                found.append(f"against the layers ({row} may import {what}): {edge}")
            elif is_bench(edge.target) and not is_bench(module):
                found.append(f"a run-time module imports bench code: {edge}")
    return found


def reachable(graph: dict[str, list[Edge]], roots: Iterable[str]) -> dict[str, Edge | None]:
    """Every module the roots import, transitively, with the edge that first reached it."""
    seen: dict[str, Edge | None] = {r: None for r in roots}
    todo = list(seen)
    while todo:
        for edge in graph.get(todo.pop(), []):
            if edge.target not in seen:
                seen[edge.target] = edge
                todo.append(edge.target)
    return seen


def chain(seen: dict[str, Edge | None], module: str) -> str:
    links = []
    edge = seen[module]
    while edge is not None:
        links.append(str(edge))
        edge = seen[edge.source]
    return "\n    ".join(reversed(links))


# ---- the repository -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Edge]]:
    return import_graph(ROOT)


@pytest.fixture(scope="module")
def rules() -> Rules:
    return parse_rules(DOC.read_text())


def test_the_doc_covers_every_package(rules: Rules) -> None:
    assert set(PACKAGES) <= set(rules.may_import)
    for prefixes in (*rules.may_import.values(), *rules.doors.values()):
        assert all(p.split(".")[0] in PACKAGES for p in prefixes), prefixes


def test_no_circle_between_modules(graph: dict[str, list[Edge]]) -> None:
    found = cycles(graph)
    assert not found, "\n".join(describe_cycle(graph, c) for c in found)


def test_every_import_follows_the_layers(graph: dict[str, list[Edge]], rules: Rules) -> None:
    found = violations(graph, rules)
    assert not found, "\n".join(found)


def test_serving_never_imports_bench_code_or_loadtests(graph: dict[str, list[Edge]]) -> None:
    assert all(root in graph for root in SERVING_ROOTS)
    seen = reachable(graph, SERVING_ROOTS)
    bad = [m for m in seen if is_bench(m) or _under(m, "loadtests")]
    assert not bad, "\n".join(f"{m}:\n    {chain(seen, m)}" for m in bad)
    assert "engine.runner.model_runner" in seen  # the walk does reach the engine


# ---- the checker catches what it must (a planted tree) --------------------------------------

PLANTED_DOC = """
<!-- import-rules -->
| module | may import |
|---|---|
| `kernels` | nothing |
| `policies` | nothing |
| `engine` | `kernels`, `policies` |
| `gateway` | `engine`, `kernels`, `policies` |
| `loadtests` | `gateway`, `engine`, `kernels`, `policies` |
<!-- /import-rules -->
<!-- import-doors -->
| module | may also import, lazily |
|---|---|
| `gateway.cli.loadtest` | `loadtests` |
<!-- /import-doors -->
"""


def plant(root: Path, files: dict[str, str]) -> dict[str, list[Edge]]:
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(root).parents:
            if folder != Path("."):
                (root / folder / "__init__.py").touch()
        path.write_text(source)
    return import_graph(root)


def test_a_planted_circle_is_caught(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "engine/a.py": "from engine import b\n",
        "engine/b.py": "def f():\n    from engine.c import x\n",  # lazy: still an edge
        "engine/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from .a import y\n"),
        "engine/d.py": "import engine.a\n",  # depends on the circle, not in it
    })
    assert cycles(graph) == [["engine.a", "engine.b", "engine.c"]]
    assert "engine.c -> engine.a (line 3)" in describe_cycle(graph, cycles(graph)[0])


def test_an_acyclic_tree_has_no_circle(tmp_path: Path) -> None:
    graph = plant(tmp_path, {"engine/a.py": "import engine.b\n", "engine/b.py": "import os\n"})
    assert cycles(graph) == []


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "kernels/op.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from engine.step import Step\n",
        "engine/step.py": "from kernels import op\n",  # downward: fine (and a circle)
        "policies/pure.py": "def f():\n    import gateway.app\n",
        "gateway/app.py": "import policies.pure\n",
    })
    found = violations(graph, parse_rules(PLANTED_DOC))
    assert len(found) == 2, found
    assert "kernels.op -> engine.step (line 3)" in found[0]
    assert "policies.pure -> gateway.app (line 2, lazy)" in found[1]


def test_loadtests_only_through_the_door_and_lazily(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "loadtests/run.py": "import gateway.app\n",
        "gateway/app.py": "",
        "gateway/cli/loadtest.py": "def run():\n    from loadtests import run\n",
        "gateway/cli/other.py": "def run():\n    from loadtests import run\n",
        "gateway/cli/eager.py": "from loadtests import run\n",
    })
    found = violations(graph, parse_rules(PLANTED_DOC))
    assert [f.split("): ", 1)[1] for f in found] == [
        "gateway.cli.eager -> loadtests.run (line 1)",
        "gateway.cli.other -> loadtests.run (line 2, lazy)",
    ]


def test_bench_code_stays_off_the_run_time_path(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "engine/bench/timing.py": "import engine.step\n",  # bench may import run-time code
        "engine/step.py": "",
        "gateway/worker.py": "def f():\n    from engine.bench import timing\n",
    })
    found = violations(graph, parse_rules(PLANTED_DOC))
    assert found == [("a run-time module imports bench code: "
                      "gateway.worker -> engine.bench.timing (line 2, lazy)")]
    seen = reachable(graph, ["gateway.worker"])
    assert is_bench("engine.bench.timing") and "engine.bench.timing" in seen
    assert "gateway.worker -> engine.bench.timing" in chain(seen, "engine.bench.timing")
