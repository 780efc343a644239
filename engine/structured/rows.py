"""Each constrained sequence's grammar state, by request id: the runner's, on the step thread.
Torch-free (``engine.runner.grammar_mask`` turns the matchers into a logits mask).

The state is the request's: it lives as long as the request, and it is always the parser
after exactly the sequence's output so far. ``matcher_for`` checks that on every step: a
state that is missing or out of step (a new sequence, an ``n > 1`` child, a request whose
state was freed) is rebuilt from the compiled grammar by replaying the spec's ``prefix``
(tokens delivered before a migration) and the output tokens. So preemption, by swap or by
recompute, keeps or rebuilds it; a migrated request rebuilds it from its delivered tokens;
``free`` drops it when the request finishes or is aborted.

A sequence whose tokens the grammar refuses (it cannot happen to tokens sampled under the
mask; it can to a replayed output made elsewhere) is left with only EOS allowed, so it ends
at its next token instead of sampling from an empty distribution.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from engine.core.outputs import ScheduledRequest
from engine.structured.compiler import GrammarCompiler

log = logging.getLogger("carpool.engine")


@dataclass
class RowState:
    matcher: Any
    consumed: int  # output tokens consumed (after the spec's prefix)
    broken: bool = False  # the grammar refused a token: only EOS from here on


class GrammarRows:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self.states: dict[str, RowState] = {}
        self.rebuilds = 0  # states rebuilt by replay, for tests and stats

    def state_for(self, row: ScheduledRequest) -> RowState:
        """The row's state, in step with its ``output_index`` output tokens."""
        state = self.states.get(row.request_id)
        if state is None or state.consumed != row.output_index:
            state = self._rebuild(row)
            self.states[row.request_id] = state
        return state

    def _rebuild(self, row: ScheduledRequest) -> RowState:
        spec = row.sampling_params.structured
        assert spec is not None
        matcher = self.compiler.matcher(spec)
        output = row.history[1][: row.output_index] if row.history is not None else []
        if len(output) != row.output_index:
            raise ValueError(f"{row.request_id}: a grammar row needs its output tokens")
        replay = [*spec.prefix, *output]
        self.rebuilds += 1
        ok = not replay or matcher.consume_tokens(replay)
        if not ok:
            log.warning("%s: the grammar refuses its own output; it ends at its next token",
                        row.request_id)
        return RowState(matcher, row.output_index, broken=not ok)

    def allows(self, row: ScheduledRequest, token: int) -> bool:
        """Whether the row's grammar accepts ``token`` next (without taking it)."""
        state = self.state_for(row)
        return not state.broken and state.matcher.validate_tokens([token]) == 1

    def advance(self, request_id: str, token: int) -> None:
        """The row sampled ``token``."""
        state = self.states.get(request_id)
        if state is None:
            return
        state.consumed += 1
        if not state.broken and not state.matcher.is_stopped():
            state.broken = not state.matcher.consume_token(token)

    def free(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.states.pop(rid, None)

    def clear(self) -> None:
        self.states.clear()

    def __len__(self) -> int:
        return len(self.states)
