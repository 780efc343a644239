"""Per-step output path: one Redis call for every output of an engine step.

The engine calls the worker's step callback on the event loop with all outputs of a step; the
writer turns them into ``TokenMsg``/``FinishMsg`` entries on ``out:{id}`` with one Lua call
(a ``StepWrite`` run by ``QueueEntries`` in ``bus/queues.py``), sent from the callback itself
when no write is in flight, else coalescing the steps that queued up meanwhile into the next
write. A finished request's queue entry is acknowledged in the same call — entries are acked
only once finished.
When the reader is gone (client disconnected, deadline), its stream is deleted instead of
written. The output tokens written are charged to the tenant's fair-queue counter in the same
call (a non-streaming request's held-back tokens when they are written, with its finish). One call rather than a pipeline of XADD/EXPIRE per request: the Python client's cost
per command dominated the step (measured with ``carpool bench gateway``), and a script makes
each step's writes atomic, so a blocked reader wakes once with the whole step (the last
tokens and the finish together).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from gateway.bus.backoff import run_forever
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg
from gateway.bus.queues import Envelope, QueueEntries, StepWrite
from gateway.bus.resp import RespConnection
from gateway.tenancy.ledger import ledger_ttl
from policies.ttft_split import WorkerMarks

log = logging.getLogger("carpool.worker")

# writes of a request between the charges of its output to its tenant's fair-queue counter
# (and one with its finish): the fair queue sees a running request's service at most this many
# writes late (a write carries one engine step's tokens, or several when steps queue behind a
# write in flight; 32 steps at 25 ms a token is under a second). Each charge is two commands:
# every 8 writes they were 0.25 of a streamed token's ~2.5 Redis commands (``bench redis``).
CHARGE_EVERY = 32

@dataclass
class Inflight:
    """A request this worker holds (in the engine or being dropped)."""

    request_id: str
    tier: str
    entry_id: str
    reader_gone: bool = False  # set by a cancel whose reader left
    queue_wait_s: float | None = None  # enqueue -> taken by this worker (for the FinishMsg)
    # Non-streaming reader: after the first tokens, outputs are held here (``held``) and
    # written with the finish (``_hold_back``)
    final_only: bool = False
    first_sent: bool = False
    held: list[RequestOutput] = field(default_factory=list)
    # Started before its claim answered (``Worker._start_early``): the claim's status. Its
    # outputs are written only once that is "run"; None = claimed before it started.
    claim: asyncio.Future[str] | None = None
    tenant: str = ""  # whose queue stream holds its entry (``bus/queues.py``)
    weight: float = 1.0  # the tenant's fair-queue weight: output tokens are charged / weight
    # output tokens delivered before this worker took the request over (a migrated request:
    # its engine counts from 0 after them)
    offset_base: int = 0
    ledger: tuple[str, str] = ("", "")  # its usage ledger row: hour, field prefix
    # the first token's marks (``policies.ttft_split.WorkerMarks``): when the drainer read it
    # (0: not read by the drainer) and the engine steps ended by then, when the engine got it
    read_unix: float = 0.0
    read_steps: int = 0
    posted_unix: float = 0.0
    marks_sent: bool = False
    # when (monotonic s) a write last set its output stream's TTL and 'sent' mark; 0: never
    # (its next write sets them; a failed write sets this back to 0)
    ttl_at: float = 0.0
    # output tokens / weight written but not yet charged to the tenant's fair-queue counter,
    # and the writes since the last charge (``CHARGE_EVERY``)
    owed: float = 0.0
    unbilled: int = 0

    @property
    def owned(self) -> bool:
        """Whether this worker may write the request's outputs (its claim said "run")."""
        return self.claim is None or (self.claim.done() and self.claim.result() == "run")


class OutputWriter:
    def __init__(self, redis: Any, keys: RedisKeys, stream_ttl_s: int,
                 ledger_retention_s: int = 0) -> None:
        self.ttl = stream_ttl_s
        self.ledger_retention_s = ledger_retention_s  # 0: the ledger is off
        self._queue: asyncio.Queue[list[tuple[Inflight, RequestOutput]] | _Sent] = asyncio.Queue()
        self._waiting = False  # the task waits for work: nothing queued or being written
        self._retry: list[tuple[Inflight, RequestOutput]] = []  # a batch whose write failed
        self._parked: list[tuple[Inflight, RequestOutput]] = []  # their claim has not answered
        self._watched: set[asyncio.Future[str]] = set()  # claims that wake us when answered
        # its own lean connection (``resp.py``): this call is made once per engine step
        self._conn = RespConnection.for_client(redis)
        self._entries = QueueEntries(redis, keys, self._conn)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def submit(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        """Take one engine step's outputs (on the event loop). When nothing is queued or
        being written they are written right here, a loop turn sooner than by the writer's
        task; otherwise they queue up and are coalesced into the next write."""
        if not items:
            return
        if self._waiting and self._queue.empty() and not self._retry:
            sent = self._write_now(items)
            if sent is not None:
                self._queue.put_nowait(sent)  # the task sees its reply before anything newer
                return
        elif not self._retry and any(_first_token(*x) for x in items):
            # a write is in flight: first tokens go now, on the same connection (its replies
            # come in order), not coalesced behind it; a first token is its request's first
            # message, so nothing of that request is queued before it
            first = [_first_token(*x) for x in items]
            sent = self._write_now([x for x, f in zip(items, first, strict=True) if f],
                                   sort=False)
            if sent is not None:
                self._queue.put_nowait(sent)
                items = [x for x, f in zip(items, first, strict=True) if not f]
                if not items:
                    return
        self._queue.put_nowait(items)

    async def run(self) -> None:
        await run_forever(self._step, "output writer", log)

    async def _step(self) -> None:
        """One write. A failed batch is written again, ahead of newer outputs, at the next
        step (after the backoff): losing a finish would hang its reader until the deadline,
        while a repeat only happens if the failure came after Redis applied the pipeline."""
        retry, self._retry = self._retry, []  # already sorted out when it first came
        if retry:
            await self._write_retrying(retry)
            return
        self._waiting = True
        try:
            first = await self._queue.get()
        finally:
            self._waiting = False
        if isinstance(first, _Sent):  # written by ``submit``: see that it went through
            await self._confirm(first)
            return
        fresh = list(first)
        # coalesce steps produced during the last write, up to a write ``submit`` made of
        # first tokens meanwhile: its reply is confirmed in its turn (a failed one is written
        # again before anything newer)
        while not self._queue.empty() and not isinstance(self._queue_head(), _Sent):
            fresh.extend(self._queue.get_nowait())  # type: ignore[arg-type]
        await self._write_retrying(self._sort_out(fresh))

    def _queue_head(self) -> list[tuple[Inflight, RequestOutput]] | _Sent:
        return self._queue._queue[0]  # type: ignore[attr-defined]  # asyncio.Queue's deque

    def _sort_out(self, fresh: list[tuple[Inflight, RequestOutput]]
                  ) -> list[tuple[Inflight, RequestOutput]]:
        """What to write of ``fresh`` (and of the parked outputs before it). Outputs of a
        request whose claim has not answered yet (``Worker._start_early``) wait in
        ``_parked``; once it answers they are written, or dropped if the request is not
        ours. Non-streaming requests' outputs are held back (``_hold_back``)."""
        fresh, self._parked = self._parked + fresh, []  # parked ones first: they are older
        ready = []
        for rec, out in fresh:
            if rec.claim is not None and not rec.claim.done():
                if rec.claim not in self._watched:
                    self._watched.add(rec.claim)
                    rec.claim.add_done_callback(self._claim_answered)
                self._parked.append((rec, out))
            else:
                ready.append((rec, out))
        return _hold_back([(rec, out) for rec, out in ready if rec.owned])

    def _claim_answered(self, claim: asyncio.Future[str]) -> None:
        self._watched.discard(claim)
        self._queue.put_nowait([])  # wake the loop: its parked outputs can go now

    @property
    def idle(self) -> bool:
        """Everything submitted so far is written or held back (a non-streaming request's
        outputs go out with its finish), and the task waits for more."""
        return self._queue.empty() and not self._retry and not self._parked and self._waiting

    def _write_now(self, fresh: list[tuple[Inflight, RequestOutput]], sort: bool = True
                   ) -> _Sent | None:
        """Sort out (unless ``sort`` is False: ``fresh`` is ready to write) and send ``fresh``
        without waiting; None if the lean connection is not up (the task then writes it).
        Nothing to write is a write that went through."""
        if self._conn is None or not self._conn.ready:
            return None
        items = self._sort_out(fresh) if sort else fresh
        step = self._step_write(items)
        return _Sent(items, self._entries.send_step_now(step) if step else None)

    async def _confirm(self, sent: _Sent) -> None:
        if sent.reply is None:
            return
        try:
            await sent.reply
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                self._failed(sent.items)
                raise
            await self._write_retrying(sent.items)  # run_script loads the script
        except Exception:
            self._failed(sent.items)
            raise

    def _failed(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        """Keep ``items`` to write again; their TTLs are set again with them (the write that
        was to set them may not have been applied)."""
        for rec, _ in items:
            rec.ttl_at = 0.0
        self._retry = items

    async def _write_retrying(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        try:
            await self._write(items)
        except Exception:
            self._failed(items)
            raise

    async def _write(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        step = self._step_write(items)
        if not step:
            return
        await self._entries.write_step(step)

    def _step_write(self, items: list[tuple[Inflight, RequestOutput]]) -> StepWrite:
        """The write of ``items`` (empty when there is nothing to write)."""
        step = self._entries.step(self.ttl, ledger_ttl(self.ledger_retention_s))
        now = time.monotonic()
        for rec, outs in _by_request(items):
            last = outs[-1]
            msgs = [] if rec.reader_gone else _token_msgs(rec, outs)
            if not last.finished and not msgs:
                continue
            # the stream's TTL and 'sent' mark: set at its first write, then again once a
            # third of the TTL has passed (not a TTL read on every token)
            refresh = bool(msgs) and now - rec.ttl_at > self.ttl / 3
            if refresh:
                rec.ttl_at = now
            for msg in msgs[:-1]:  # n > 1: a message per run of one sequence's outputs
                step.add(rec.request_id, rec.tier, rec.entry_id, rec.reader_gone, msg, None,
                         tenant=rec.tenant, refresh=refresh)
                refresh = False
            tokens = msgs[-1] if msgs else None
            step.add(rec.request_id, rec.tier, rec.entry_id, rec.reader_gone, tokens,
                     _finish(rec, last) if last.finished else None, tenant=rec.tenant,
                     refresh=refresh, charge=_charge(rec, msgs, last.finished),
                     ledger=rec.ledger)
        return step


def _charge(rec: Inflight, msgs: list[TokenMsg], finished: bool) -> float:
    """The output charge this write carries to the tenant's fair-queue counter: what was
    owed, every ``CHARGE_EVERY`` writes and at the finish (two counter writes a request per
    step were the largest share of a streamed token's Redis commands)."""
    rec.owed += sum(len(m.token_ids) for m in msgs) / rec.weight
    rec.unbilled += 1
    if not finished and rec.unbilled < CHARGE_EVERY:
        return 0.0
    charge, rec.owed, rec.unbilled = rec.owed, 0.0, 0
    return charge


@dataclass
class _Sent:
    """A write ``submit`` made itself: its items (to write again if it failed) and reply."""

    items: list[tuple[Inflight, RequestOutput]]
    reply: asyncio.Future[Any] | None


def _first_token(rec: Inflight, out: RequestOutput) -> bool:
    """Whether ``out`` carries the first token of a streamed request the drainer started, ready
    to write as it is (claimed, nothing held back or parked before it). It must be the
    request's first output: nothing written yet is not enough, for the first may be parked
    behind a claim that answered since (the second then went first: its reader saw a gap,
    ``output_lost``; bench sla's echo rows, a few requests a run)."""
    return (not rec.marks_sent and rec.read_unix > 0 and not rec.offset_base
            and bool(out.new_token_ids) and out.num_output_tokens == len(out.new_token_ids)
            and not rec.final_only and not rec.reader_gone
            and (rec.claim is None or (rec.claim.done() and rec.claim.result() == "run")))


def _hold_back(items: list[tuple[Inflight, RequestOutput]]
               ) -> list[tuple[Inflight, RequestOutput]]:
    """What to write now. A non-streaming request's outputs after its first tokens wait in
    its record and go out with its finish: its reader only answers at the end, so a message
    per engine step would cost Redis and the gateway a write and a read each for nothing
    (vLLM's FINAL_ONLY outputs; the first tokens still go out, for TTFT)."""
    out: list[tuple[Inflight, RequestOutput]] = []
    for rec, o in items:
        if not rec.final_only:
            out.append((rec, o))
        elif o.finished:
            out += [(rec, h) for h in rec.held] + [(rec, o)]
            rec.held = []
        elif rec.first_sent:
            rec.held.append(o)
        else:
            rec.first_sent = bool(o.new_token_ids or o.text_delta)
            out.append((rec, o))
    return out


def _token_msgs(rec: Inflight, outs: list[RequestOutput]) -> list[TokenMsg]:
    """The token messages of one request's outputs: steps that queued up behind a slow write
    become one message, per run of one sequence (``index``; n > 1) up to its end
    (``choice_finish``); a run with neither tokens nor an end is left out."""
    runs: list[list[RequestOutput]] = []
    for o in outs:
        if runs and runs[-1][-1].index == o.index and runs[-1][-1].choice_finish is None:
            runs[-1].append(o)
        else:
            runs.append([o])
    msgs = []
    for run in runs:
        ids = [t for o in run for t in o.new_token_ids]
        text = "".join(o.text_delta for o in run)
        end = run[-1].choice_finish
        if not (ids or text or end):
            continue
        lps = [[x.logprob, x.top] for o in run for x in o.logprobs or ()] or None
        offset = rec.offset_base + run[-1].num_output_tokens - len(ids)
        msgs.append(TokenMsg(ids, text, lps, offset=offset, index=run[-1].index,
                             finish_reason=end, ttft_marks=_first_marks(rec, run[0], ids)))
    return msgs


def _first_marks(rec: Inflight, out: RequestOutput, ids: list[int]) -> list[float] | None:
    """The worker's TTFT marks for the message carrying ``rec``'s first token, once; None
    for every other message (and for a request the drainer did not read: a resumed one)."""
    if rec.marks_sent or not ids or rec.read_unix <= 0 or rec.offset_base:
        return None
    rec.marks_sent = True
    now_unix, now_mono = time.time(), time.monotonic()
    first = out.first_token_time
    token = now_unix if first is None else now_unix - (now_mono - first)
    sched = out.first_scheduled_time
    step = out.first_token_step
    return WorkerMarks(
        rec.read_unix, rec.posted_unix,
        token if sched is None else now_unix - (now_mono - sched), token,
        -1 if step is None else step - rec.read_steps,
        -1 if step is None or out.first_scheduled_step is None
        else step - out.first_scheduled_step + 1).to_list()


def _by_request(items: list[tuple[Inflight, RequestOutput]]
                ) -> list[tuple[Inflight, list[RequestOutput]]]:
    """Group outputs by request, keeping each request's order (dicts keep insertion order)."""
    groups: dict[str, tuple[Inflight, list[RequestOutput]]] = {}
    for rec, out in items:
        groups.setdefault(rec.request_id, (rec, []))[1].append(out)
    return list(groups.values())


def _finish(rec: Inflight, out: RequestOutput) -> FinishMsg:
    # a migrated request's engine prompt holds the tokens delivered before (``offset_base``):
    # the usage is the original prompt's and every output token's, each counted once
    return FinishMsg(out.finish_reason or FinishReason.STOP,
                     out.num_prompt_tokens - rec.offset_base,
                     out.num_output_tokens + rec.offset_base,
                     out.error, queue_wait_s=rec.queue_wait_s,
                     num_preemptions=out.num_preemptions,
                     cached_tokens=min(out.num_cached_tokens,
                                       out.num_prompt_tokens - rec.offset_base))


def inflight_record(env: Envelope, msg: SubmitMsg, claim: asyncio.Future[str] | None = None
              ) -> Inflight:
    """The record of ``env``'s request (``msg``, its decoded entry) as a worker runs it."""
    return Inflight(msg.request_id, env.tier, env.entry_id, final_only=not msg.stream,
                    claim=claim, tenant=env.tenant, weight=env.weight,
                    ledger=(msg.ledger_hour, msg.ledger_prefix))
