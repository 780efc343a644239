"""The pure half of request migration (``gateway/worker/recovery.py``): what a dead
worker's reader was sent, read back from its output stream, and the request that resumes
after it; checked against streams written by the real encoder."""

from __future__ import annotations

import json
from typing import Any

from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg, encode
from gateway.worker.recovery import DeadWorkers, delivered_tokens, resumed_submit


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


def status(ts: float) -> bytes:
    return json.dumps({"ts": ts}).encode()


def test_a_worker_is_dead_after_two_rounds_without_a_fresh_status() -> None:
    dead = DeadWorkers("me")
    now = 1000.0
    statuses = {b"me": status(now), b"live": status(now - 1), b"old": status(now - 60)}
    holders = {"me", "live", "old", "never"}
    assert dead.update(statuses, holders, now) == set()  # suspected only
    assert dead.update(statuses, holders, now + 2) == {"old", "never"}
    assert dead.update(statuses, {"live"}, now + 4) == set()


def test_nobody_is_dead_while_our_own_status_is_stale() -> None:
    dead = DeadWorkers("me")
    stale = {b"me": status(0.0)}  # e.g. right after a Redis outage
    assert dead.update(stale, {"other"}, 1000.0) == set()
    assert dead.update(stale, {"other"}, 1002.0) == set()
    fresh = {b"me": status(1003.0)}
    assert dead.update(fresh, {"other"}, 1003.0) == set()  # a round to publish first
    assert dead.update(fresh, {"other"}, 1005.0) == {"other"}
