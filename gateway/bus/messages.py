"""Everything that crosses Redis is one of these dataclasses, with one encoder/decoder.

A message is stored as two stream fields (or one pub/sub payload): ``t`` names the type and
``d`` is the JSON of its fields. Token ids cross Redis, not text, on the way in (the gateway
tokenizes: it needs the counts for quotas); on the way out a ``TokenMsg`` carries both the new
ids and the text the worker detokenized for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine.core.finish import FinishReason
from engine.core.sampling_params import SamplingParams
from engine.core.structured import StructuredSpec


@dataclass(frozen=True)
class SubmitMsg:
    """The envelope a gateway puts on ``queue:{tier}``; a worker turns it into an engine request."""

    request_id: str
    tenant_id: str
    tier: str
    priority: int
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    arrival_unix: float = 0.0  # handed to Redis (the admission script)
    deadline_unix: float = 0.0  # the worker drops/aborts it after this
    received_unix: float = 0.0  # its HTTP request reached the gateway (0: not known)
    traceparent: str | None = None  # W3C trace context, so one trace spans gateway and worker
    # False: the reader wants the whole answer only (a non-streaming response): the worker
    # writes the first tokens (the gateway measures TTFT on them) and the rest with the
    # finish, not a message per engine step
    stream: bool = True
    # OpenAI's and vLLM's other sampling fields (``SamplingParams`` says what each does)
    top_k: int = 0
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: list[list[float]] = field(default_factory=list)  # [token_id, bias] pairs
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k: the sampled token's and k alternatives
    stop_token_ids: list[int] = field(default_factory=list)
    n: int = 1  # choices, sharing the prompt's KV blocks
    # the usage ledger's row (``tenancy/ledger.py``): the worker adds the completion tokens
    # it computed there at the finish; '' = no ledger
    ledger_hour: str = ""
    ledger_prefix: str = ""
    # the output constraint (``engine.core.structured``): "" = none; the prefix: output
    # tokens a resumed request delivered before, which its grammar replays
    structured_kind: str = ""
    structured_source: str = ""
    structured_prefix: list[int] = field(default_factory=list)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(self.stop),
            top_k=self.top_k,
            min_p=self.min_p,
            min_tokens=self.min_tokens,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=tuple((int(t), float(b)) for t, b in self.logit_bias),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            stop_token_ids=tuple(self.stop_token_ids),
            n=self.n,
            structured=StructuredSpec(self.structured_kind, self.structured_source,
                                      tuple(self.structured_prefix))
            if self.structured_kind else None,
        )


@dataclass(frozen=True)
class TokenMsg:
    """New tokens of one request after one engine step."""

    token_ids: list[int]
    text: str
    # per token when the request asked for logprobs: [logprob, [[id, logprob], ...]]
    logprobs: list[Any] | None = None
    # how many output tokens of the request came before these: a reader drops a message it
    # already has (a write retried after Redis applied it; a migrated request's overlap).
    # None: not known (an older worker)
    offset: int | None = None
    # n > 1: the choice these tokens belong to, and its finish reason once it ended
    index: int = 0
    finish_reason: str | None = None
    # the first message of a request only: the worker's TTFT marks
    # (``policies.ttft_split.WorkerMarks.to_list``); None on every other
    ttft_marks: list[float] | None = None


@dataclass(frozen=True)
class FinishMsg:
    """The last message on ``out:{id}``: why it ended and the usage to settle quotas with."""

    finish_reason: str  # a FinishReason
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    # What only the worker knows, for the gateway's request span (None: not known, or an
    # older worker that does not send them).
    queue_wait_s: float | None = None
    num_preemptions: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache


# How a request ended, by its finish reason: the stats counters the worker's finish and the
# gateway's settle add to (``completed`` for a natural end: stop or length).
OUTCOMES: dict[str, str] = {FinishReason.ABORT: "aborted", FinishReason.ERROR: "errored"}


def outcome(finish_reason: str) -> str:
    return OUTCOMES.get(finish_reason, "completed")


_REASON_OF_OUTCOME: dict[str, FinishReason] = {
    out: FinishReason(reason) for reason, out in OUTCOMES.items()}


def reason_of_outcome(outcome_name: str) -> FinishReason:
    """The finish reason an outcome stands for, the inverse of ``outcome`` (for whoever has
    only the outcome, e.g. telemetry): ``completed`` -> STOP, as which natural end it was
    (stop or length) is not in the outcome."""
    return _REASON_OF_OUTCOME.get(outcome_name, FinishReason.STOP)


@dataclass(frozen=True)
class CancelMsg:
    """Published on the cancel channel. ``reader_gone`` tells the worker nobody reads the
    output any more (client disconnected or timed out), so it deletes the stream instead of
    writing a final event into it."""

    request_id: str
    reader_gone: bool
    reason: str = "cancelled"


@dataclass(frozen=True)
class HandoffMsg:
    """Published on the cancel channel by a worker that stops (``Worker.drain``): ``target``
    takes over every queue entry ``source`` still holds, at once, and resumes each from the
    tokens its reader already has, as it would a dead worker's."""

    source: str
    target: str


Message = SubmitMsg | TokenMsg | FinishMsg | CancelMsg | HandoffMsg
_TYPES: dict[str, type[Any]] = {
    "submit": SubmitMsg,
    "token": TokenMsg,
    "finish": FinishMsg,
    "cancel": CancelMsg,
    "handoff": HandoffMsg,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}
# Field names per type, read once: every field is a plain value or a list, so a shallow
# dict is the same JSON as ``dataclasses.asdict`` without its recursive deep copy (the writer
# encodes one message per request per engine step).
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _TYPES.values()}


class MessageError(ValueError):
    """A payload that is not a well-formed message."""


def encode(msg: Message) -> dict[str, str]:
    """Stream fields for ``msg`` (``XADD key * t <type> d <json>``)."""
    cls = type(msg)
    data = {name: getattr(msg, name) for name in _FIELDS[cls]}
    return {"t": _NAMES[cls], "d": orjson.dumps(data).decode()}


def encode_payload(msg: Message) -> str:
    """One string for pub/sub."""
    fields = encode(msg)
    return fields["t"] + "|" + fields["d"]


def decode(fields: dict[Any, Any]) -> Message:
    """Inverse of ``encode``; accepts bytes or str keys/values as redis-py returns them."""
    kind = _text(fields.get("t", fields.get(b"t")))
    data = _text(fields.get("d", fields.get(b"d")))
    return _build(kind, data)


def decode_payload(payload: bytes | str) -> Message:
    kind, sep, data = _text(payload).partition("|")
    if not sep:
        raise MessageError("payload without a type")
    return _build(kind, data)


def _build(kind: str, data: str) -> Message:
    cls = _TYPES.get(kind)
    if cls is None:
        raise MessageError(f"unknown message type {kind!r}")
    try:
        values = orjson.loads(data)
        if not isinstance(values, dict):
            raise TypeError("not a JSON object")
        # fields a newer sender added are left out: old and new processes run side by side
        # during an upgrade (a new field's default must keep the old behaviour)
        known = {k: v for k, v in values.items() if k in _FIELDS[cls]}
        return cls(**known)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as exc:
        raise MessageError(f"bad {kind} message: {exc}") from exc


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if value is None:
        raise MessageError("missing message field")
    return str(value)
