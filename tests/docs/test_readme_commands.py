"""Every command README.md shows is run here, or checked where running it is too long.

- ``carpool tenants ...`` and ``carpool simulate ...``: run, in README order, by bash, against
  an embedded Redis of their own.
- ``curl`` and the Python (``openai`` client) blocks: run against a real gateway + worker +
  engine serving a tiny random Llama under the bundled model's name, with the demo tenant's
  key in ``CARPOOL_KEY``, as after ``make serve`` (only the host and port are rewritten).
- ``carpool ... --help``: run (the CLI's ``main``), and every flag its comment names must be in
  the help it prints.
- The other ``carpool`` commands (a server, a benchmark, a model): parsed by the very parser
  that would run them (a benchmark's own for ``bench``), so a renamed flag or choice fails.
- ``make <target>``: ``make -n`` (the target exists and its recipe expands).
- ``python -m pytest <file>``: run.

A README command that fits none of these fails the test: give it a rule here.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docs.markdown import (
    README,
    REPO,
    code_blocks,
    comment,
    parse_carpool,
    shell_commands,
    words,
)

COMMANDS = shell_commands(README)
PY_BLOCKS = [body for lang, body in code_blocks(README) if lang == "python"]
SERVED_AT = "http://127.0.0.1:8000"
RUN_CARPOOL = ("tenants", "simulate")  # fast, no model: run for real


def kind(command: str) -> str:
    w = words(command)
    if w[0] == "make":
        return "make"
    if w[0] == "curl":
        return "curl"
    if Path(w[0]).name.startswith("python") and w[1:3] == ["-m", "pytest"]:
        return "pytest"
    if w[0] == "carpool":
        if "--help" in w:
            return "help"
        return "run" if w[1] in RUN_CARPOOL else "parse"
    raise AssertionError(f"README command with no rule in {__name__}: {command!r}")


def of_kind(k: str) -> list[str]:
    return [c for c in COMMANDS if kind(c) == k]


def bash(command: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_every_command_has_a_rule_and_the_set_up_comes_first() -> None:
    kinds = [kind(c) for c in COMMANDS]  # raises on a command with no rule
    assert [words(c) for c in COMMANDS[:2]] == [["make", "serve"], ["make", "test"]]
    for k in ("make", "curl", "help", "run", "parse", "pytest"):
        assert k in kinds, f"the README shows no {k} command any more: drop its rule"
    assert PY_BLOCKS, "the README shows no Python block any more"


@pytest.mark.parametrize("command", of_kind("make"))
def test_make_target(command: str) -> None:
    w = words(command)
    done = bash("make -n " + " ".join(w[1:]), {**os.environ}, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("command", of_kind("help"))
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(words(command)[1:])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and out.startswith("usage: carpool"), out
    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", comment(command)):
        assert flag in out, f"{command!r}: its comment names {flag}, its help does not"


@pytest.mark.parametrize("command", of_kind("parse"))
def test_parse(command: str) -> None:
    try:
        parse_carpool(words(command)[1:])
    except SystemExit as exc:
        raise AssertionError(f"carpool refuses the README's {command!r}") from exc


def test_pytest_command() -> None:
    (command,) = of_kind("pytest")
    done = bash(command, {**os.environ}, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout


def test_tenants_and_simulate_commands_run(redis_url: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Run by the CLI's ``main`` in this process (the console script's entry point), with
    the shell's ``$VAR`` expansion; a subprocess each would only add interpreter starts."""
    from gateway.cli.main import main

    for name, value in {"REDIS_URL": redis_url, "CARPOOL_STATE_DIR": str(tmp_path),
                        "CARPOOL_NAMESPACE": f"readme{uuid.uuid4().hex[:8]}",
                        "CARPOOL_SECRET": "readme-test-secret-0123456789abcdef"}.items():
        monkeypatch.setenv(name, value)
    ran = []
    for command in of_kind("run"):
        w = words(os.path.expandvars(command))
        code = main(w[1:])
        out = capsys.readouterr().out
        assert code == 0, f"{command!r} exited {code}:\n{out}"
        if w[1:3] == ["tenants", "keys"]:  # the README's "$KEY_ID": a key id from 'keys'
            monkeypatch.setenv("KEY_ID", out.split()[0])
        if w[1:3] == ["tenants", "create"]:
            assert "key (shown once): cp-" in out
        if w[1:3] == ["tenants", "revoke-key"]:
            assert out.strip() == "revoked"
        if w[1:3] == ["simulate", "seed000"]:
            assert "static  continuous" in out
        ran.append(w[1:3])
    assert ["tenants", "revoke-key"] in ran and ["tenants", "keys"] in ran


# -- a first request: curl and the openai client against a served model -------------------


@pytest.fixture(scope="module")
def served(redis_url: str, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Any, str]]:
    """gateway + worker + the real engine on a tiny random Llama that carries the bundled
    model's name and tokenizer; the demo tenant `carpool serve` creates, and its key."""
    from engine.model_files import model_name
    from gateway.cli.serve import DEMO_TENANT
    from tests.gateway.harness import make_config, run_gateway, store_for
    from tests.model_factories import make_tiny_llama_dir

    name = model_name(smollm2_dir)
    model = make_tiny_llama_dir(tmp_path_factory.mktemp("readme") / name,
                                tokenizer_dir=smollm2_dir)
    config = make_config(engine="real", model=str(model), engine_options={
        "num_blocks": 64, "block_size": 16, "max_num_seqs": 8, "max_model_len": 512})

    async def demo_key() -> str:
        client, store = store_for(redis_url, config.namespace)
        try:
            await store.put(DEMO_TENANT)
            return (await store.issue_key(DEMO_TENANT.id))[0]
        finally:
            await client.aclose()

    import asyncio

    with run_gateway(config, redis_url) as gw:
        yield gw, asyncio.run(demo_key())


def test_the_readme_names_the_model_make_serve_serves(smollm2_dir: Path) -> None:
    from engine.model_files import model_name

    served_name = model_name(smollm2_dir)
    shown = set(re.findall(r'"model": "([^"]+)"', README.read_text()))
    shown |= set(re.findall(r'model="([^"]+)"', README.read_text()))
    assert shown == {served_name}


@pytest.mark.parametrize("command", of_kind("curl"))
def test_curl(command: str, served: tuple[Any, str]) -> None:
    gw, key = served
    assert SERVED_AT in command
    done = bash(command.replace(SERVED_AT, gw.url), {**os.environ, "CARPOOL_KEY": key})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"error"' not in out, out
    if "/v1/models" in command:
        assert '"object":"list"' in out.replace(" ", "")
    elif '"stream": true' in command:
        assert out.rstrip().endswith("data: [DONE]"), out
    else:
        assert '"choices"' in out and '"usage"' in out, out


@pytest.mark.parametrize("index", range(len(PY_BLOCKS)))
def test_python_block(index: int, served: tuple[Any, str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    gw, key = served
    source = PY_BLOCKS[index]
    assert SERVED_AT in source
    monkeypatch.setenv("CARPOOL_KEY", key)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source.replace(SERVED_AT, gw.url), f"README python block {index}", "exec"),  # noqa: S102 (the README's own block)
             {"__name__": "__readme__"})
    assert out.getvalue().strip(), "the block printed nothing"
