"""The reference tables are true of the code, read from the code itself (not from lists kept
by hand): every flag of every command and every environment variable is in the page that
documents it, every API field the gateway knows is in docs/api.md, every metric the pages
name is exported, and every command and module the pages show exists."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from tests.docs.markdown import (
    DOCS,
    README,
    REPO,
    bench_parser,
    option_strings,
    parse_carpool,
    shell_commands,
    subcommand_parser,
    words,
)

PAGE = {name: REPO / "docs" / f"{name}.md" for name in
        ("deployment", "slo", "api", "operations", "planning", "benchmarks")}
BENCHES = ("engine", "kernels", "gateway", "sla", "serve", "gpu", "redis")


def table_rows(path: Path) -> str:
    """The page's table rows, where a flag or a variable is documented."""
    return "\n".join(line for line in path.read_text().splitlines() if line.startswith("|"))


def documented(flag: str, path: Path) -> bool:
    return re.search(rf"`{re.escape(flag)}`", table_rows(path)) is not None


@pytest.mark.parametrize(("command", "page"), [
    ("serve", README), ("tenants", README), ("doctor", PAGE["operations"]),
    ("simulate", PAGE["planning"]), ("plan", PAGE["planning"]),
    ("calibrate", PAGE["planning"]), ("loadtest", PAGE["benchmarks"]),
])
def test_every_flag_is_in_its_table(command: str, page: Path) -> None:
    missing = [f for f in sorted(option_strings(subcommand_parser(command)))
               if not documented(f, page) and not (command == "tenants" and f in README.read_text())]
    assert not missing, f"carpool {command}: not in {page.name}'s tables: {missing}"


@pytest.mark.parametrize("target", BENCHES)
def test_every_bench_flag_is_in_benchmarks_md(target: str) -> None:
    missing = [f for f in sorted(option_strings(bench_parser(target)))
               if not documented(f, PAGE["benchmarks"])]
    assert not missing, f"carpool bench {target}: not in benchmarks.md: {missing}"


def test_every_environment_variable_is_in_the_readme() -> None:
    from engine.core.config import FORCE_TRITON_ENV
    from gateway.config import OTLP_ENDPOINT_ENV, GatewayConfig

    names = {"REDIS_URL" if f.name == "redis_url" else f"CARPOOL_{f.name.upper()}"
             for f in dataclasses.fields(GatewayConfig) if f.name != "otlp_endpoint"}
    names |= {OTLP_ENDPOINT_ENV, FORCE_TRITON_ENV, "OMP_WAIT_POLICY"}
    text = README.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"README.md does not document {missing}"


def test_every_serve_default_in_the_readme_is_the_code_s() -> None:
    from engine.core.config import CacheConfig, ModelConfig, SchedulerConfig
    from gateway.config import GatewayConfig

    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `(--[a-z-]+)` \| [^|]* \| `([^`]+)` \|", README.read_text(), re.MULTILINE)}
    g, m, c, s = GatewayConfig(), ModelConfig(), CacheConfig(), SchedulerConfig()
    code = {"--host": g.host, "--port": g.port, "--role": g.role, "--engine": g.engine,
            "--echo-step-ms": g.echo_step_ms, "--namespace": g.namespace,
            "--dtype": m.dtype, "--device": m.device, "--max-num-seqs": s.max_num_seqs,
            "--max-num-batched-tokens": s.max_num_batched_tokens,
            "--kv-cache-memory-gb": c.kv_cache_memory_gb, "--block-size": c.block_size,
            "--preemption-mode": s.preemption_mode, "--kv-cache-dtype": c.kv_cache_dtype}
    for flag, value in code.items():
        shown = rows.get(flag, "").split(" ")[0]
        assert shown and float(shown) == value if isinstance(value, (int, float)) \
            else shown == value, f"README: {flag} default {shown!r}, the code's {value!r}"


def test_every_api_field_is_in_api_md() -> None:
    from gateway.http.openai.fields import HONOURED, UNSUPPORTED

    text = table_rows(PAGE["api"])
    fields = set().union(*HONOURED.values(), *(set(u) for u in UNSUPPORTED.values()))
    missing = sorted(f for f in fields if f"`{f}`" not in text)
    assert not missing, f"docs/api.md does not name {missing}"


def test_every_metric_named_is_exported() -> None:
    from gateway.telemetry.metrics import Metrics

    exported = set(Metrics().registry._names_to_collectors)
    for page in [README, *DOCS]:
        for name in set(re.findall(r"\b((?:carpool|gen_ai)_[a-z0-9_]+)", page.read_text())):
            assert name in exported, f"{page.name} names {name}, which Carpool does not export"


def test_every_python_module_shown_exists() -> None:
    for page in [README, *DOCS]:
        for module in set(re.findall(r"python -m (\w+(?:\.\w+)*)", page.read_text())):
            if module != "pytest":
                assert importlib.util.find_spec(module), f"{page.name}: no module {module}"


DOC_COMMANDS = [(page.name, c) for page in DOCS for c in shell_commands(page)
                if words(c) and words(c)[0] == "carpool"]


@pytest.mark.parametrize(("page", "command"), DOC_COMMANDS)
def test_every_carpool_command_in_docs_parses(page: str, command: str) -> None:
    try:
        parse_carpool(words(command)[1:])
    except SystemExit as exc:
        if exc.code == 0 and "--help" in words(command):
            return
        raise AssertionError(f"{page}: carpool refuses {command!r}") from exc
