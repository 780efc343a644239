"""Request migration: a request whose worker died after streaming output resumes here.

A worker that takes over a dead worker's entry (``Worker._maintain``: XAUTOCLAIM after the
visibility timeout) finds it ``lost`` when its reader already has output (the claim script's
'sent' mark). Instead of ending it with a ``worker_lost`` error, the new worker reads what
the reader has been sent, the request's output stream ``out:{id}`` (a stream entry is
written once per engine step, atomically, so it is exactly what was delivered or will be),
and resumes by recompute: the engine prefills the original prompt plus those tokens and
continues for the tokens that remain. Its token messages carry offsets counted from the
tokens delivered before (``Inflight.offset_base``), so the relay drops any overlap and the
client's stream just continues; its finish reports the original prompt and every output
token once. A greedy request therefore ends with the text an uninterrupted run produces. A
constrained request's grammar replays the delivered tokens first (``structured_prefix``), so
its output still matches the grammar as a whole.

A worker that stops in order (``Worker.drain``) does not wait to be found dead: past its
drain deadline it names a live worker (``handoff.py``) on the cancel channel, which takes
its entries at once and resumes them the same way.

A dead worker is known two ways: its entries went idle past the visibility timeout (the
XAUTOCLAIM of the fleet's checker, ``checker``), or, sooner, ``DeadWorkers``: it holds
pending entries but its tier status (``tier_status.py``, republished every second) has not
changed for ``STALE_AFTER_S`` on the checker's own clock (``liveness.py``: another host's time
stamp is never compared with ours, so a worker whose clock runs ahead cannot declare live
workers dead).

Not resumed (ended with the ``worker_lost`` error as before): several choices (``n`` > 1),
and a request whose output stream is gone (expired, or held back past its TTL). Known gaps: a
stop string split across the hand-over point is not seen, a seeded sampled request continues
with another random stream, and a character whose bytes straddle it may be rendered as
U+FFFD; a greedy request is exact otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from gateway.bus.client import text
from gateway.bus.messages import MessageError, SubmitMsg, TokenMsg, decode
from gateway.worker.liveness import StatusAges
from gateway.worker.tier_status import STALE_AFTER_S


def delivered_tokens(entries: Any) -> list[int] | None:
    """The output token ids an ``XRANGE out:{id}`` reply holds, in order, each once (a
    repeated write has the same ``offset``); None when the stream is gone or holds
    something that can't be resumed from (an entry without offsets, another choice)."""
    if not entries:
        return None
    tokens: list[int] = []
    for _, fields in entries:
        if isinstance(fields, list):  # a raw reply: [field, value, field, value, ...]
            fields = dict(zip(fields[::2], fields[1::2]))
        try:
            msg = decode(fields)
        except MessageError:
            return None
        if not isinstance(msg, TokenMsg):
            return None  # a finish (the request ended) or a stray entry: not ours to resume
        if msg.offset is None or msg.index != 0 or msg.offset > len(tokens):
            return None
        tokens += msg.token_ids[len(tokens) - msg.offset:]
    return tokens


def resumed_submit(msg: SubmitMsg, delivered: list[int]) -> SubmitMsg | None:
    """The request to run so that it continues after ``delivered``: their tokens appended to
    the prompt, the budgets reduced by as many; None when it cannot be resumed."""
    if msg.n != 1:
        return None
    k = len(delivered)
    # a grammar replays what was delivered (``StructuredSpec.prefix``)
    prefix = [*msg.structured_prefix, *delivered] if msg.structured_kind else []
    return dataclasses.replace(
        msg, prompt_token_ids=[*msg.prompt_token_ids, *delivered],
        max_tokens=msg.max_tokens - k, min_tokens=max(0, msg.min_tokens - k),
        structured_prefix=prefix)


class DeadWorkers:
    """Which consumers holding pending entries are dead: their status unchanged (or absent)
    for ``STALE_AFTER_S`` on this worker's monotonic clock, seen so in two rounds in a row
    (after a Redis outage no status changes until its worker publishes again, within a
    second), and only while this worker's own status is changing (statuses are being
    published at all)."""

    def __init__(self, me: str) -> None:
        self.me = me
        self._ages = StatusAges()
        self._suspects: set[str] = set()
        self._statuses: dict[Any, Any] = {}  # the status hash as last read

    def observe(self, statuses: dict[Any, Any], now: float) -> None:
        """Record the status hash as read now, without judging anyone."""
        self._ages.observe(statuses, now)
        self._statuses = statuses

    def live(self, now: float) -> set[str]:
        """The workers whose status changed within ``STALE_AFTER_S``."""
        return self._ages.fresh(now, STALE_AFTER_S)

    def checks(self, statuses: dict[Any, Any], now: float) -> bool:
        """Whether this worker looks for dead ones this round (``statuses`` as read now, on
        this process's clock): the least id among the live workers whose status does not say
        they drain (``checker``). The others skip the round, and forget their suspects: a
        verdict still takes two rounds of one checker in a row."""
        self.observe(statuses, now)
        mine = self.is_checker(now)
        if not mine:
            self._suspects = set()
        return mine

    def is_checker(self, now: float) -> bool:
        """Whether this worker is the fleet's checker by the statuses last observed (it also
        runs the visibility-timeout reclaim alone: ``upkeep.Upkeep.maintain``). It defers
        only to a worker it has seen change (a status only sighted may be a dead worker's
        that others already judge stale: a new worker would defer to it while they defer to
        the new one); while none qualifies every worker is the checker."""
        mine = {self.me} & self._ages.fresh(now, STALE_AFTER_S)  # the others see us live
        chosen = checker(self._statuses, self._ages.changing(now, STALE_AFTER_S) | mine)
        return chosen is None or chosen == self.me

    def update(self, statuses: dict[Any, Any], holders: set[str], now: float) -> set[str]:
        """``statuses``: the tier status hash (worker id -> its JSON status) as read now;
        ``holders``: the consumers with pending entries; ``now``: this process's
        ``time.monotonic()``. Returns the ones to take over now."""
        self.observe(statuses, now)
        live = self._ages.fresh(now, STALE_AFTER_S)
        if self.me not in live:
            self._suspects = set()
            return set()
        suspects = holders - live - {self.me}
        dead, self._suspects = suspects & self._suspects, suspects
        return dead


def checker(statuses: dict[Any, Any], live: set[str]) -> str | None:
    """The one worker that scans the pending index for dead workers' holdings: the least id
    among ``live`` whose status is a worker's (JSON) and does not say it drains; None when
    there is none. Every worker scanning it cost one XPENDING per
    indexed stream per worker each round: O(workers x running tenants) a round (16 workers:
    ~0.1 Redis command per streamed token, ``carpool bench redis``). A checker that dies is
    succeeded once its status goes stale (``STALE_AFTER_S``)."""
    out: str | None = None
    for key, raw in statuses.items():
        name = text(key)
        if name not in live or (out is not None and name >= out):
            continue
        try:
            status = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(status, dict) and not status.get("draining"):
            out = name
    return out
