"""The pure half of request migration (``gateway/worker/recovery.py``): what a dead
worker's reader was sent, read back from its output stream, and the request that resumes
after it; checked against streams written by the real encoder."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from gateway.bus.client import text
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg, encode
from gateway.worker.handoff import handoff_target
from gateway.worker.recovery import DeadWorkers, checker, delivered_tokens, resumed_submit


def entries(*msgs: Any) -> list[Any]:
    """An XRANGE reply as the lean connection returns it: [id, [field, value, ...]]."""
    out = []
    for i, msg in enumerate(msgs):
        fields = encode(msg)
        out.append([f"{i}-0".encode(), [b"t", fields["t"].encode(), b"d", fields["d"].encode()]])
    return out


def test_tokens_in_order_and_a_repeated_write_once() -> None:
    got = delivered_tokens(entries(TokenMsg([5, 6], "ab", offset=0), TokenMsg([7], "c", offset=2),
                                   TokenMsg([7], "c", offset=2), TokenMsg([8, 9], "de", offset=3)))
    assert got == [5, 6, 7, 8, 9]


def test_an_overlapping_write_adds_only_what_is_new() -> None:
    got = delivered_tokens(entries(TokenMsg([5, 6], "ab", offset=0),
                                   TokenMsg([6, 7], "bc", offset=1)))
    assert got == [5, 6, 7]


def test_what_cannot_be_resumed_from() -> None:
    assert delivered_tokens([]) is None  # the stream is gone
    assert delivered_tokens(entries(TokenMsg([5], "a"))) is None  # no offsets
    assert delivered_tokens(entries(TokenMsg([5], "a", offset=0),
                                    TokenMsg([7], "c", offset=2))) is None  # a gap
    assert delivered_tokens(entries(TokenMsg([5], "a", offset=0),
                                    FinishMsg("length", 3, 1))) is None  # it ended
    assert delivered_tokens(entries(TokenMsg([5], "a", offset=0, index=1))) is None  # n > 1


def test_the_resumed_request_continues_after_the_delivered_tokens() -> None:
    msg = SubmitMsg("r", "t", "interactive", 0, [1, 2, 3], max_tokens=10, min_tokens=4,
                    temperature=0.0)
    resumed = resumed_submit(msg, [7, 8, 9])
    assert resumed is not None
    assert resumed.prompt_token_ids == [1, 2, 3, 7, 8, 9]
    assert (resumed.max_tokens, resumed.min_tokens) == (7, 1)
    assert len(resumed.prompt_token_ids) + resumed.max_tokens == 3 + 10  # same context
    assert resumed_submit(SubmitMsg("r", "t", "interactive", 0, [1], max_tokens=5, n=2),
                          [7]) is None


def test_a_constrained_request_resumes_with_its_grammar_replaying_what_was_delivered() -> None:
    msg = SubmitMsg("r", "t", "interactive", 0, [1, 2], max_tokens=10,
                    structured_kind="json_object")
    once = resumed_submit(msg, [5, 6])
    assert once is not None and once.structured_prefix == [5, 6]
    twice = resumed_submit(once, [7])  # its second worker died too
    assert twice is not None and twice.structured_prefix == [5, 6, 7]
    spec = twice.sampling_params().structured
    assert spec is not None and spec.prefix == (5, 6, 7) and spec.kind == "json_object"
    assert resumed_submit(SubmitMsg("r", "t", "interactive", 0, [1], max_tokens=5),
                          [7]).structured_prefix == []  # type: ignore[union-attr]


def status(ts: float) -> bytes:
    return json.dumps({"ts": ts}).encode()


def test_a_worker_is_dead_once_its_status_stops_changing_for_two_rounds() -> None:
    """Rounds every 2 s on the checker's monotonic clock; "live" republishes each round,
    "old" never changes after the first sighting, "never" has no status at all."""
    dead = DeadWorkers("me")
    holders = {"me", "live", "old", "never"}
    got = {}
    for t in (0.0, 2.0, 4.0, 6.0, 8.0):
        statuses = {b"me": status(1000 + t), b"live": status(1000 + t), b"old": status(1000.0)}
        got[t] = dead.update(statuses, holders, t)
        holders -= got[t]  # taken over: no longer holds entries
    # "old" is unchanged past STALE_AFTER_S (5 s) first at t=6 (suspect), dead at t=8
    assert got == {0.0: set(), 2.0: {"never"}, 4.0: set(), 6.0: set(), 8.0: {"old"}}


def test_skewed_clocks_do_not_make_live_workers_dead() -> None:
    """Stamps a minute ahead and a minute behind the checker's clock, either way: only
    whether a status changes counts (the old check took "behind" for dead, and a checker
    ahead took everyone for dead)."""
    wall = time.time()
    for me_skew, other_skew in ((60.0, 0.0), (0.0, -60.0), (0.0, 60.0), (-60.0, 60.0)):
        dead = DeadWorkers("me")
        for t in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0):
            statuses = {b"me": status(wall + me_skew + t), b"other": status(wall + other_skew + t)}
            assert dead.update(statuses, {"me", "other"}, t) == set(), (me_skew, other_skew, t)
        frozen = {b"me": status(wall + me_skew + 12), b"other": status(wall + other_skew + 10)}
        outcomes = [dead.update({**frozen, b"me": status(wall + me_skew + t)}, {"other"}, t)
                    for t in (12.0, 14.0, 16.0, 18.0)]
        assert outcomes == [set(), set(), set(), {"other"}], (me_skew, other_skew)


def test_nobody_is_dead_while_our_own_status_is_not_changing() -> None:
    dead = DeadWorkers("me")
    stale = {b"me": status(0.0)}  # e.g. a Redis outage: our own publish fails too
    assert dead.update(stale, {"other"}, 0.0) == set()  # first sighting: "other" suspected
    assert dead.update(stale, {"other"}, 6.0) == set()  # ours unchanged 6 s: no verdicts
    assert dead.update(stale, {"other"}, 8.0) == set()
    assert dead.update({b"me": status(9.0)}, {"other"}, 9.0) == set()  # a round first
    assert dead.update({b"me": status(11.0)}, {"other"}, 11.0) == {"other"}


def load_status(running: int, draining: bool = False) -> bytes:
    return json.dumps({"running": running, "draining": draining}).encode()


def test_a_draining_worker_hands_off_to_the_least_busy_live_worker_not_draining() -> None:
    statuses = {b"me": load_status(3), b"a": load_status(2), b"b": load_status(1), b"c": load_status(0, True),
                b"dead": load_status(0), b"bad": b"{"}
    live = {"me", "a", "b", "c", "bad"}
    assert handoff_target(statuses, live, "me") == "b"
    assert handoff_target(statuses, live - {"b"}, "me") == "a"
    assert handoff_target(statuses, {"me", "c"}, "me") is None  # draining, or not live
    assert handoff_target({b"me": load_status(1)}, {"me"}, "me") is None  # alone


def test_live_is_what_changed_within_the_stale_window() -> None:
    dead = DeadWorkers("me")
    dead.observe({b"me": b"1", b"a": b"1"}, 0.0)
    dead.observe({b"me": b"2", b"a": b"1"}, 100.0)
    assert dead.live(100.0) == {"me"}


def test_the_checker_is_the_least_live_worker_not_draining() -> None:
    """Against a plain reading: of the live workers in the hash, those whose status is JSON
    and does not say draining, the least id."""
    rng = random.Random(7)
    names = ["a", "b", "bad", "c", "w10", "w2"]
    for _ in range(300):
        statuses = {n.encode(): rng.choice([load_status(1), load_status(0, True), b"{", b"x"])
                    for n in names if rng.random() < 0.8}
        live = {n for n in names if rng.random() < 0.7}
        plain = sorted(text(k) for k, v in statuses.items() if text(k) in live
                       and v.startswith(b"{") and v != b"{" and b'"draining": true' not in v)
        assert checker(statuses, live) == (plain[0] if plain else None), (statuses, live)


def test_one_worker_checks_a_round_and_another_takes_over_once_it_is_stale() -> None:
    workers = {n: DeadWorkers(n) for n in ("a", "b", "c")}
    rounds = []
    for t in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0):
        # "a" stops publishing after t=2; "b" and "c" go on
        statuses = {b"a": status(1000 + min(t, 2.0)), b"b": status(1000 + t),
                    b"c": status(1000 + t)}
        rounds.append({n: w.checks(statuses, t) for n, w in workers.items()})
    # at first sight nobody is seen to change: each checks, as every worker did before; then
    # "a"; "a" is stale past 5 s at t=8 (on b's clock)
    assert [sorted(n for n, mine in r.items() if mine) for r in rounds] == [
        ["a", "b", "c"], ["a"], ["a"], ["a"], ["b"], ["b"]]


def test_a_new_worker_does_not_defer_to_a_status_it_has_only_sighted() -> None:
    """A dead worker's status, stale to the others, is new to a worker started since: it
    checks itself rather than defer to the dead one (the others defer to it once they see
    its status change)."""
    old, new = DeadWorkers("b"), DeadWorkers("c")
    for t in (0.0, 2.0, 4.0, 6.0, 8.0):
        statuses = {b"a": status(1000.0), b"b": status(1000 + t)}  # "a" died at t=0
        old.observe(statuses, t)
    statuses = {b"a": status(1000.0), b"b": status(1010.0), b"c": status(1010.0)}
    assert old.checks(statuses, 10.0)  # "a" stale on b's clock; "c" only sighted
    assert new.checks(statuses, 10.0)  # "a" and "b" only sighted by "c"
    later = {b"a": status(1000.0), b"b": status(1012.0), b"c": status(1012.0)}
    assert old.checks(later, 12.0) and not new.checks(later, 12.0)  # "c" defers to "b"


def test_a_worker_that_stops_checking_forgets_its_suspects() -> None:
    dead = DeadWorkers("me")
    assert dead.update({b"me": status(0.0), b"a": status(0.0)}, {"gone"}, 0.0) == set()
    # "gone" suspected; then a round where "a" (a lesser id, seen to change) checks: ours is
    # skipped, the suspicion dropped
    assert not dead.checks({b"me": status(2.0), b"a": status(2.0)}, 2.0)
    assert dead.update({b"me": status(4.0)}, {"gone"}, 4.0) == set()  # suspected anew
    assert dead.update({b"me": status(6.0)}, {"gone"}, 6.0) == {"gone"}
