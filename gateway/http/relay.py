"""Relays one admitted request's output stream (``out:{id}``) to its HTTP client.

The response is an ASGI callable that relays (reads the output stream through the process's
``OutputMux``, writes SSE chunks or collects the full body) while a watcher task waits on the
ASGI receive channel for ``http.disconnect`` and cancels the relay if it comes first. A
finished relay answers; a disconnect, the request's deadline, a client that stops reading
(a send blocked past the stall timeout), or the server's shutdown (``shutdown.py``: the
client is told so) cancels the request end to end. In every case the quota reservation is
settled exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from engine.core.finish import FinishReason
from gateway.bus.messages import FinishMsg, Message, TokenMsg, outcome
from gateway.http.cancel import wait_for_disconnect
from gateway.http.errors import (
    APIError,
    error_bytes,
    output_lost,
    request_lost,
    server_shutting_down,
)
from gateway.http.openai.format import SSE_DONE, Formatter, sse
from gateway.tenancy.ledger import LedgerEntry
from gateway.tenancy.tenants import Tenant
from policies.ttft_split import WorkerMarks, ttft_split

if TYPE_CHECKING:  # services.py builds what the relay uses: imported for types only
    from gateway.http.services import Services

log = logging.getLogger("carpool.gateway")

CLEANUP_TIMEOUT_S = 5.0
# A request with no output this long (queued, or its admission lost in a failover) checks
# that Redis still has it, and again as often: one EXISTS per waiting request per period.
LOST_CHECK_S = 5.0
# How long the shutdown's last event may take to send: the relays are ended ``END_MARGIN_S``
# (1 s, ``cli/serve.py``) before uvicorn cancels them, and a send blocked on a client that
# stopped reading must not still be waiting then (a traceback), nor delay the cancel after it.
SHUTDOWN_SEND_TIMEOUT_S = 0.25


class Stalled(Exception):
    """The client stopped reading: a send did not complete within the stall timeout."""


class AdmissionLost(Exception):
    """The request's record is gone from Redis while it waits for output: a failing-over
    master had acknowledged the admission but not replicated it, so no worker will ever run
    it. The client is told at once (``request_lost``) instead of at its deadline."""


class OutputGap(Exception):
    """Token messages are missing before the one that came (its ``offset`` is past the
    tokens received): writes a failing-over Redis master had acknowledged but not yet
    replicated are gone. The client is told (``output_lost``) rather than sent a text with a
    hole in it."""


@dataclass
class RelayState:
    msgs: list[TokenMsg] = field(default_factory=list)  # a non-streamed answer's, to format
    completion_tokens: int = 0
    delivered_tokens: int = 0  # in bodies handed to the client's connection (the ledger's)
    finish: FinishMsg | None = None
    headers_sent: bool = False
    first_token_at: float | None = None


@dataclass(frozen=True)
class RelayContext:
    request_id: str
    tenant: Tenant
    tier: str
    prompt_tokens: int
    reserved_tokens: int
    stream: bool
    include_usage: bool
    formatter: Formatter
    started: float  # loop time at arrival
    deadline: float  # loop time
    ledger_hour: str = ""  # the usage ledger's row (``tenancy/ledger.py``); '' = none
    ledger_prefix: str = ""
    # sent with the response's status: the admission's x-ratelimit-* headers
    headers: tuple[tuple[bytes, bytes], ...] = ()
    budget_key: str = ""  # the admission's budget charge, replaced at the settle
    budget_charge: int = 0
    # wall clock: the HTTP request arrived, its envelope went to Redis (the TTFT budget's
    # gateway marks, ``policies.ttft_split``)
    received_unix: float = 0.0
    enqueued_unix: float = 0.0


class RelayResponse:
    def __init__(self, services: Services, ctx: RelayContext) -> None:
        self.services = services
        self.ctx = ctx
        self.state = RelayState()
        self.closing = False  # set on the way out: the reader loop stops at its next turn
        self.relaying = False  # reading the output (a disconnect now cancels the relay)
        # who cancelled the relay, once one has: "disconnect" (the watcher) or "shutdown"
        self.ended_by: str | None = None
        self._task: asyncio.Task[Any] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = self.ctx
        # The relay runs right here, not in a task of its own: the output reaches the client
        # two event-loop turns sooner (a task's end, then the wait on it, were turns on every
        # request's path). The watcher cancels this task when the client goes away.
        me = self._task = asyncio.current_task()
        watcher = asyncio.create_task(self._watch(receive, me))
        deadline = asyncio.timeout_at(ctx.deadline)
        cancel_source: str | None = None
        shutdown = self.services.shutdown
        try:
            self.relaying = True  # only meanwhile does a disconnect cancel this task
            shutdown.track(self)
            try:
                async with deadline:
                    if ctx.stream:
                        await self._stream(send)
                    else:
                        await self._collect()
            finally:
                self.relaying = False
            if not ctx.stream:
                await self._send_full(send)
        except TimeoutError:
            if not deadline.expired():
                cancel_source = "error"
                raise
            cancel_source = "deadline"
            await self._send_error_end(send, APIError(
                504, f"request exceeded the server deadline of "
                     f"{self.services.config.request_timeout_s:g}s", code="timeout"))
        except Stalled:
            cancel_source = "stalled"
        except OutputGap:
            cancel_source = "output_lost"  # the worker stops generating what nobody reads
            await self._send_error_end(send, output_lost())
        except AdmissionLost:
            cancel_source = "lost"
            await self._send_error_end(send, request_lost())
        except asyncio.CancelledError:
            if self.ended_by is None or me is None:
                raise  # cancelled from outside (uvicorn): the clean-up below still runs
            cancel_source = self.ended_by
            if me.uncancel() > 0:  # our cancel is handled; one from outside still ends us
                raise
            if cancel_source == "shutdown":
                await self._send_error_end(send, server_shutting_down(),
                                           timeout_s=SHUTDOWN_SEND_TIMEOUT_S)
            elif cancel_source == "lost":
                await self._send_error_end(send, request_lost())
        except Exception:
            cancel_source = "error"  # nobody reads this output any more: stop generating
            raise  # the clean-up below still cancels and settles
        finally:
            self.closing = True
            shutdown.untrack(self)
            watcher.cancel()
            # Clean-up runs in its own task with bounded waits: whatever happens to this one
            # (cancelled at shutdown, an error above), the cancel and the settle still happen.
            await asyncio.shield(self._finish(cancel_source, watcher))

    async def _watch(self, receive: Receive, relay: asyncio.Task[Any] | None) -> None:
        """Cancel the relay when the client disconnects while it relays (not while it sends
        the answer or the timeout error: uvicorn drops sends to a client that has left)."""
        await wait_for_disconnect(receive)
        if self.relaying and relay is not None and self.ended_by is None:
            self.ended_by = "disconnect"
            relay.cancel()

    def end_for_shutdown(self) -> None:
        """Cancel the relay so that it tells its client the server is shutting down and
        cancels its request (``Shutdown.end_inflight``). Not while it already answers: that
        ends on its own."""
        if self.relaying and self._task is not None and self.ended_by is None:
            self.ended_by = "shutdown"
            self._task.cancel()

    def end_if_waiting(self) -> bool:
        """End the relay with a 503 if no output has reached it yet: Redis lost its data, and
        with it this request's queue entry (``http/recovery.py``), so none ever will. One
        with output goes on: its worker still writes the rest."""
        if (self.relaying and self._task is not None and self.ended_by is None
                and self.state.first_token_at is None and self.state.finish is None):
            self.ended_by = "lost"
            self._task.cancel()
            return True
        return False

    async def _finish(self, cancel_source: str | None, watcher: asyncio.Task[Any]) -> None:
        await asyncio.wait({watcher}, timeout=CLEANUP_TIMEOUT_S)
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                outcome = _outcome(self.state.finish)
                if cancel_source:
                    try:
                        outcome = await self._cancel(cancel_source)
                    except RedisError:  # settled all the same: retried until Redis is back
                        outcome = _outcome(FinishMsg(FinishReason.ABORT, 0, 0))
                await self._settle(outcome, _error_code(cancel_source, self.state.finish))
        except (RedisError, TimeoutError) as exc:  # Redis away or frozen: the outage is
            # logged once (by the request path's calls), not per request
            log.debug("clean-up of %s failed: %r", self.ctx.request_id, exc)
        except Exception:
            log.exception("clean-up of %s failed", self.ctx.request_id)

    async def _batches(self) -> Any:
        """Lists of messages: everything the process's output mux has delivered for this
        request since the last turn (several reads coalesce when the relay fell behind)."""
        mux = self.services.mux
        key = self.services.keys.out(self.ctx.request_id, self.ctx.tenant.id)
        queue = mux.register(key)
        try:
            while not self.closing:
                if self.state.first_token_at is not None:
                    batch = await queue.get()
                else:  # no output yet: now and then, ask whether Redis still has the request
                    try:
                        # not ``wait_for``: on 3.11 it can swallow the relay's cancel (a client
                        # gone) when the get completes at the same moment, and the relay read
                        # on to the request's end (tests/gateway/http/test_cancel.py)
                        async with asyncio.timeout(LOST_CHECK_S):
                            batch = await queue.get()
                    except TimeoutError:
                        await self._check_admitted()
                        continue
                while not queue.empty():
                    batch = batch + queue.get_nowait()
                yield self._fresh(batch)
        finally:
            mux.unregister(key)

    async def _check_admitted(self) -> None:
        """Raise ``AdmissionLost`` if the request's record is gone from Redis (it lives
        past the deadline): only a failover that lost the admission removes it this early.
        Redis away: nothing is known, the request waits on."""
        try:
            found = await self.services.redis.exists(
                self.services.keys.req(self.ctx.request_id, self.ctx.tenant.id))
        except RedisError:
            return
        if not found:
            raise AdmissionLost(self.ctx.request_id)

    def _fresh(self, batch: list[Message]) -> list[Message]:
        """``batch`` without the token messages already received (an ``offset`` behind the
        tokens so far): a step write the worker retried after Redis had applied it. A
        message past them (tokens missing before it) raises ``OutputGap``."""
        out, have = [], self.state.completion_tokens
        for msg in batch:
            if isinstance(msg, TokenMsg) and msg.offset is not None:
                if msg.offset < have:
                    continue
                if msg.offset > have:
                    raise OutputGap(f"tokens {have}..{msg.offset - 1} missing")
                have = msg.offset + len(msg.token_ids)
            out.append(msg)
        return out

    async def _collect(self) -> None:
        async for batch in self._batches():
            for msg in batch:
                if isinstance(msg, TokenMsg):
                    self._on_tokens(msg)
                elif isinstance(msg, FinishMsg):
                    self.state.finish = msg
                    return

    async def _stream(self, send: Send) -> None:
        ctx, fmt = self.ctx, self.ctx.formatter
        await self._send(send, {"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-request-id", ctx.request_id.encode()), *ctx.headers]})
        self.state.headers_sent = True
        if fmt.kind == "chat":
            await self._body(send, fmt.first_chunks())  # the role, per choice
        async for batch in self._batches():
            # One socket write per batch: the text of every token message already here goes
            # out together, one event per choice (any split of the text is a valid stream).
            toks = []
            for msg in batch:
                if isinstance(msg, TokenMsg):
                    self._on_tokens(msg)
                    toks.append(msg)
                elif isinstance(msg, FinishMsg):
                    self.state.finish = msg
                    out = fmt.tokens(toks)
                    if msg.finish_reason == FinishReason.ERROR:
                        out += sse(_finish_error(msg).body())
                    else:
                        out += fmt.finish_chunks(msg.finish_reason)
                        if ctx.include_usage:
                            out += fmt.usage_chunk(ctx.prompt_tokens, self.state.completion_tokens,
                                                   msg.cached_tokens)
                    await self._body(send, out + SSE_DONE, more=False)
                    self._delivered(toks)
                    return
            await self._body(send, fmt.tokens(toks))
            self._delivered(toks)

    def _delivered(self, toks: list[TokenMsg]) -> None:
        self.state.delivered_tokens += sum(len(m.token_ids) for m in toks)

    def _on_tokens(self, msg: TokenMsg) -> None:
        state = self.state
        if state.first_token_at is None and msg.token_ids:
            state.first_token_at = time.monotonic()
            marks = WorkerMarks.of_list(msg.ttft_marks)
            split = None if marks is None or not self.ctx.received_unix else ttft_split(
                self.ctx.received_unix, self.ctx.enqueued_unix, marks, time.time())
            self.services.events.first_token(self.ctx.request_id, self.ctx.tier,
                                             asyncio.get_running_loop().time() - self.ctx.started,
                                             split=split, marks=marks)
        state.completion_tokens += len(msg.token_ids)
        if not self.ctx.stream:
            state.msgs.append(msg)
        self.services.events.tokens(self.ctx.request_id, len(msg.token_ids))

    async def _send(self, send: Send, message: dict[str, Any],
                    timeout_s: float | None = None) -> None:
        """Send, or raise ``Stalled`` after ``timeout_s`` (default: the stall timeout)."""
        try:
            async with asyncio.timeout(timeout_s or self.services.config.stall_timeout_s):
                await send(message)
        except TimeoutError as exc:
            raise Stalled() from exc

    async def _body(self, send: Send, data: bytes, more: bool = True,
                    timeout_s: float | None = None) -> None:
        if data or not more:
            await self._send(send, {"type": "http.response.body", "body": data,
                                    "more_body": more}, timeout_s)

    async def _send_full(self, send: Send) -> None:
        finish, ctx = self.state.finish, self.ctx
        assert finish is not None
        if finish.finish_reason == FinishReason.ERROR:
            err = _finish_error(finish)
            status, body = err.status, error_bytes(err)
        else:
            status = 200
            body = orjson.dumps(ctx.formatter.full(self.state.msgs, finish.finish_reason,
                                                   ctx.prompt_tokens, finish.completion_tokens
                                                   or self.state.completion_tokens,
                                                   finish.cached_tokens))
        await self._send(send, {"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (b"x-request-id", ctx.request_id.encode()), *ctx.headers]})
        await self._send(send, {"type": "http.response.body", "body": body})
        if status == 200:
            self.state.delivered_tokens = (finish.completion_tokens
                                           or self.state.completion_tokens)

    async def _send_error_end(self, send: Send, err: APIError,
                              timeout_s: float | None = None) -> None:
        """End the response with ``err``: a started stream gets it as its last event, then
        ``[DONE]``; otherwise it is the response (with Retry-After when it says one). Each
        send waits up to ``timeout_s`` (default: the stall timeout)."""
        with contextlib.suppress(Exception):  # Stalled too: the client is not reading
            if self.state.headers_sent:
                await self._body(send, sse(err.body()), timeout_s=timeout_s)
                await self._body(send, SSE_DONE, more=False, timeout_s=timeout_s)
            else:
                headers = [(b"content-type", b"application/json"), *self.ctx.headers]
                if err.retry_after is not None:
                    headers.append((b"retry-after", b"%d" % err.retry_after))
                await self._send(send, {"type": "http.response.start", "status": err.status,
                                        "headers": headers}, timeout_s)
                await self._send(send, {"type": "http.response.body", "body": error_bytes(err)},
                                 timeout_s)

    async def _cancel(self, source: str) -> str:
        svc = self.services
        await svc.canceller.cancel(self.ctx.request_id, self.ctx.tenant.id, reader_gone=True,
                                   reason=source, tier=self.ctx.tier)
        await svc.redis.delete(svc.keys.out(self.ctx.request_id, self.ctx.tenant.id))
        svc.events.request_cancelled(self.ctx.request_id, source)
        return outcome(FinishReason.ABORT)

    async def _settle(self, outcome: str, error: str) -> None:
        svc, ctx = self.services, self.ctx
        used, finish = self.state.completion_tokens, self.state.finish
        if finish is not None:
            used = max(used, finish.completion_tokens)
        usage = LedgerEntry(ctx.ledger_hour, ctx.ledger_prefix, ctx.prompt_tokens,
                            (finish.cached_tokens or 0) if finish else 0,
                            self.state.delivered_tokens, error) if ctx.ledger_hour else None
        # read to its end: the output stream is deleted in the same call
        await svc.quota.settle(ctx.tenant, ctx.request_id, ctx.reserved_tokens,
                               ctx.prompt_tokens + used, f"settled:{outcome}",
                               delete_key=svc.keys.out(ctx.request_id, ctx.tenant.id) if finish else None,
                               usage=usage, budget_key=ctx.budget_key,
                               budget_charge=ctx.budget_charge)
        svc.events.request_finished(ctx.tenant.id, ctx.tier, ctx.request_id, outcome,
                                    ctx.prompt_tokens, used,
                                    asyncio.get_running_loop().time() - ctx.started,
                                    engine_finish_reason=finish.finish_reason if finish else None,
                                    queue_wait_s=finish.queue_wait_s if finish else None,
                                    num_preemptions=finish.num_preemptions if finish else None)


def _outcome(finish: FinishMsg | None) -> str:
    if finish is None:
        return outcome(FinishReason.ERROR)
    return outcome(finish.finish_reason)


# The ledger's error code of a relay cancelled by ``cancel_source``
_CANCEL_CODES = {"disconnect": "cancelled_by_client", "deadline": "timeout",
                 "stalled": "client_stalled", "shutdown": "server_shutdown",
                 "lost": "request_lost", "error": "gateway_error",
                 "output_lost": "output_lost"}


def _error_code(cancel_source: str | None, finish: FinishMsg | None) -> str:
    """How the request ended, for the ledger's ``err:{code}``; '' for a natural end."""
    if cancel_source is not None:
        return _CANCEL_CODES.get(cancel_source, cancel_source)
    if finish is None:
        return "gateway_error"
    if finish.finish_reason == FinishReason.ERROR:
        return _finish_error(finish).code or "engine_error"
    if finish.finish_reason == FinishReason.ABORT:
        return "cancelled"
    return ""


def _finish_error(finish: FinishMsg) -> APIError:
    text = finish.error or "the engine failed this request"
    status = 503 if "worker lost" in text else 500
    return APIError(status, text, code="worker_lost" if status == 503 else "engine_error")
