"""What the docs tests read out of README.md and docs/*.md: fenced code blocks, the shell
commands in them, relative links, and the real parsers that the commands are checked against."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
SHELL_LANGS = ("sh", "bash", "shell", "console")

_FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(?<!\!)\[[^\]\n]*\]\(([^)\s]+)\)")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(lang.lower(), body) for lang, body in _FENCE.findall(path.read_text())]


def shell_commands(path: Path) -> list[str]:
    """Every command of the file's shell blocks, continuation lines joined, in order;
    blank and comment-only lines left out (a trailing comment stays: bash ignores it)."""
    out: list[str] = []
    for lang, body in code_blocks(path):
        if lang not in SHELL_LANGS:
            continue
        pending = ""
        for line in body.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command and not command.startswith("#"):
                out.append(command)
    return out


def words(command: str) -> list[str]:
    """The command's words as the shell splits them, comments and leading ``VAR=value``
    assignments left out."""
    parts = shlex.split(command, comments=True)
    while parts and _ENV_ASSIGN.match(parts[0]):
        parts.pop(0)
    return parts


def comment(command: str) -> str:
    """The trailing comment of a command line ('' when none), outside quotes."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[i + 1:]
    return ""


def relative_links(path: Path) -> list[str]:
    """Targets of the file's Markdown links that are not URLs (code blocks left out)."""
    text = _FENCE.sub("", path.read_text())
    return [t for t in _LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the file's headings: lower case, punctuation dropped, spaces to
    hyphens."""
    text = _FENCE.sub("", path.read_text())
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug)
    return out


# -- the real parsers ----------------------------------------------------------------------


class _Grabbed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``carpool <name>``, from the CLI's own ``build_parser``."""
    from gateway.cli.main import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError("carpool has no subcommands")


def bench_parser(target: str) -> argparse.ArgumentParser:
    """The parser ``carpool bench <target>`` hands its arguments to: the benchmark module
    builds it in its ``main``; it is caught at its first ``parse_args``, before anything runs."""
    from gateway.cli.main import main

    original = argparse.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, args: object = None,
             namespace: object = None) -> argparse.Namespace:
        if self.prog.startswith("carpool bench "):
            raise _Grabbed(self)
        return original(self, args, namespace)  # type: ignore[call-overload]

    argparse.ArgumentParser.parse_args = grab  # type: ignore[assignment]
    try:
        main(["bench", target])
    except _Grabbed as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError(f"carpool bench {target} parsed no arguments")


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--flag`` of the parser and of its subcommands, ``--help`` left out."""
    out: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= option_strings(sub)
        out |= {s for s in action.option_strings if s.startswith("--") and s != "--help"}
    return out


def parse_carpool(argv: list[str]) -> argparse.Namespace:
    """Parse ``carpool <argv>`` with the parser that would run it (a benchmark's own for
    ``bench``), so an unknown flag or a bad choice fails here; for ``serve``, also build the
    gateway and engine configs it would start with (their validation). Nothing runs."""
    from gateway.cli.main import build_parser

    args = build_parser().parse_args(argv)
    if args.command == "bench":
        bench_parser(args.target).parse_args(args.rest)
    if args.command == "serve":  # the configs it would build, validated (nothing starts)
        from engine.core.config import EngineConfig
        from gateway.cli.main import CONFIG_FLAGS, ENGINE_FLAGS
        from gateway.config import GatewayConfig

        engine = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k) is not None}
        GatewayConfig.from_env({}, **{k: getattr(args, k) for k in CONFIG_FLAGS})
        EngineConfig.from_kwargs(**engine)
    return args
