"""Telemetry speaks the engine's finish-reason vocabulary (``engine.core.finish``) and labels a
preemption only with a mode it was told (a step fact), never a guessed one."""

from __future__ import annotations

import ast
import time
from pathlib import Path

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from gateway.bus.messages import OUTCOMES
from gateway.telemetry import names
from tests.gateway.telemetry.factories import make_telemetry, spans_by_name

ROOT = Path(__file__).resolve().parents[3]
# Where finish reasons are read or written; engine.core.finish alone spells them.
USERS = [*sorted((ROOT / "gateway" / "telemetry").glob("*.py")),
         ROOT / "engine" / "core" / "output_processor.py"]
SPELLINGS = {r.value for r in FinishReason} | set(OUTCOMES.values())


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants that are not docstrings, with their line numbers."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_no_finish_reason_is_spelled_outside_the_vocabulary() -> None:
    assert len(USERS) > 5  # the glob found the package
    found = [f"{p.relative_to(ROOT)}:{line} {value!r}" for p in USERS
             for line, value in _literals(p) if value in SPELLINGS]
    assert found == []


def _output(n: int, *, preempt: int, finished: bool = False) -> RequestOutput:
    now = time.monotonic()
    return RequestOutput("r", [1], "x", finished=finished,
                         finish_reason=FinishReason.LENGTH if finished else None,
                         num_prompt_tokens=3, num_output_tokens=n, first_scheduled_time=now,
                         first_token_time=now, finish_time=now if finished else None,
                         num_preemptions=preempt)


def _preemption_events(preempted_mode: str | None) -> list[dict[str, object]]:
    tel, exporter = make_telemetry()
    wt = tel.worker_trace(request_id="r", tier="batch", traceparent=None, arrival_unix=0)
    wt.on_output(_output(1, preempt=0))
    if preempted_mode is not None:  # the step observer saw it
        wt.on_preempted(preempted_mode)
    wt.on_output(_output(2, preempt=1, finished=True))
    decode = spans_by_name(exporter)[names.SPAN_DECODE]
    assert (decode.attributes or {})[names.NUM_PREEMPTIONS] == 1
    return [dict(e.attributes or {}) for e in decode.events if e.name == names.EVENT_PREEMPTION]


def test_a_preemption_known_only_by_its_count_gets_no_mode() -> None:
    # A swap preemption the step facts missed must not be labelled "recompute".
    assert _preemption_events(None) == [{}]


def test_a_preemption_from_a_step_fact_keeps_its_mode_and_counts_once() -> None:
    for mode in ("recompute", "swap"):
        assert _preemption_events(mode) == [{names.PREEMPTION_MODE: mode}]
