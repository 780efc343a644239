"""Requests posted to the engine and not yet placed count in its load by their own priority
(``Inbox.pending``): a burst of lower-tier requests the drainer just pulled must not fill
interactive's short engine queue until the step in progress ends (bench sla's 32-seat row)."""

from __future__ import annotations

from pathlib import Path

from engine.core.sampling_params import SamplingParams
from engine.frontend.async_engine import AsyncEngine
from engine.frontend.inbox import Inbox
from policies.admission import MAX_ENGINE_WAITING, engine_has_capacity

INTERACTIVE, BEST_EFFORT = 0, 2


def test_a_posted_message_is_pending_until_its_consumer_has_applied_it() -> None:
    inbox = Inbox()
    inbox.post("add", "a", priority=BEST_EFFORT)
    inbox.post("call", "setting")  # no priority: never pending
    inbox.post("add", "b", priority=INTERACTIVE)
    inbox.post("add", "c", priority=BEST_EFFORT)
    assert inbox.pending() == ((INTERACTIVE, 1), (BEST_EFFORT, 2))
    seen = []
    for kind, payload in inbox.drain():
        seen.append((kind, payload, inbox.pending()))  # inside the body: not applied yet
    assert seen == [("add", "a", ((INTERACTIVE, 1), (BEST_EFFORT, 2))),
                    ("call", "setting", ((INTERACTIVE, 1), (BEST_EFFORT, 1))),
                    ("add", "b", ((INTERACTIVE, 1), (BEST_EFFORT, 1))),
                    ("add", "c", ((BEST_EFFORT, 1),))]
    assert inbox.pending() == ()


def test_lower_requests_not_yet_placed_leave_interactive_room(tiny_model_dir: Path) -> None:
    engine = AsyncEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=64,
                                     max_num_seqs=32)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for i in range(2 * MAX_ENGINE_WAITING):  # not started: they stay in the inbox
        engine.add_request(f"be{i}", [5, 6, 7, i], params, priority=BEST_EFFORT)
    posted = engine.load()
    engine._drain_inbox()  # what the step thread does at the top of its next step
    placed = engine.load()
    # the reference: the scheduler's own count once they are placed
    assert placed.waiting_by_priority == ((BEST_EFFORT, 2 * MAX_ENGINE_WAITING),)
    assert (posted.num_waiting, posted.waiting_by_priority) == (
        placed.num_waiting, placed.waiting_by_priority)
    for load in (posted, placed):
        assert engine_has_capacity(load, INTERACTIVE)  # interactive is still pulled
        assert not engine_has_capacity(load, BEST_EFFORT)  # its own short queue is full
