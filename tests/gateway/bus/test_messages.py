"""FinishMsg's optional worker facts: they round-trip, and a FinishMsg from an older worker
(without them) still decodes, with None for what it did not say; one from a newer sender
decodes without the fields it added."""

from __future__ import annotations

import json

import pytest

from engine.core.finish import COMPLETED, FinishReason
from gateway.bus.messages import (
    FinishMsg,
    MessageError,
    decode,
    decode_payload,
    encode,
    encode_payload,
    outcome,
    reason_of_outcome,
)


def test_finish_round_trips_queue_wait_and_preemptions() -> None:
    msg = FinishMsg("length", 12, 90, queue_wait_s=0.25, num_preemptions=2)
    assert decode(encode(msg)) == msg
    assert decode_payload(encode_payload(msg)) == msg
    raw = {k.encode(): v.encode() for k, v in encode(msg).items()}  # as redis-py returns it
    assert decode(raw) == msg


def test_finish_from_an_older_worker_decodes() -> None:
    old = {"t": "finish", "d": json.dumps({"finish_reason": "stop", "prompt_tokens": 3,
                                           "completion_tokens": 4, "error": None})}
    msg = decode(old)
    assert isinstance(msg, FinishMsg)
    assert (msg.completion_tokens, msg.queue_wait_s, msg.num_preemptions) == (4, None, None)


def test_a_field_from_a_newer_sender_is_left_out() -> None:
    newer = {"t": "finish", "d": json.dumps({"finish_reason": "stop", "prompt_tokens": 3,
                                             "completion_tokens": 4, "spec_tokens": 9})}
    assert decode(newer) == FinishMsg("stop", 3, 4)
    with pytest.raises(MessageError):
        decode({"t": "finish", "d": "[1, 2]"})
    with pytest.raises(MessageError):
        decode({"t": "finish", "d": json.dumps({"finish_reason": "stop"})})  # missing fields


@pytest.mark.parametrize("reason", list(FinishReason))
def test_outcome_by_finish_reason(reason: FinishReason) -> None:
    """One table: a natural end (``COMPLETED``) counts as completed, the rest as cut short."""
    got = outcome(reason)
    assert (got == "completed") == (reason in COMPLETED)
    assert got == outcome(str(reason))  # as decoded from a FinishMsg: a plain string
    assert got in ("completed", "aborted", "errored")


@pytest.mark.parametrize("reason", list(FinishReason))
def test_reason_of_outcome_inverts_outcome(reason: FinishReason) -> None:
    """A cut-short end comes back as itself; a natural one as a natural one (STOP)."""
    back = reason_of_outcome(outcome(reason))
    assert outcome(back) == outcome(reason)
    assert back == (FinishReason.STOP if reason in COMPLETED else reason)
