"""The worker: drains tier queues into an engine and streams its outputs back through Redis.

One worker per engine (per GPU). Tasks on the event loop:
  drainer      tier choice by WRR, tenant by fair queuing, pull when the engine has room
               (``drainer.py``)
  writer       one pipelined write per engine step (``writer.py``)
  cancels      CancelMsg from any gateway -> ``engine.abort(id)`` (KV freed at the next step);
               a HandoffMsg naming us -> take a stopping worker's entries (``handoff.py``)
  maintenance  heartbeat our pending entries; XAUTOCLAIM entries of dead workers (the
               fleet's checker alone)
  dead check   take over the entries of a worker that stopped publishing its status, sooner
               than the visibility timeout (``recovery.py``)
  step budget  caps the rows of a step while interactive work runs (``step_budget.py``)
  tier status  publishes each tier's depth, service rate and targets (``tier_status.py``)
``drain`` (SIGTERM in a worker process) stops taking work, lets what runs finish within the
drain deadline, then hands what is left to another worker; ``stop`` (then, or the app's
shutdown) ends what the worker still runs, see ``_end_inflight``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

from redis.exceptions import RedisError

from engine.core.finish import COMPLETED, FinishReason
from engine.core.outputs import RequestOutput
from engine.protocol import EngineClient
from gateway.bus.backoff import run_forever, stop_tasks
from gateway.bus.client import blocking_client
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import CancelMsg, HandoffMsg, MessageError, SubmitMsg, decode_payload
from gateway.bus.queues import Envelope, TierQueues
from gateway.config import GatewayConfig
from gateway.telemetry.events import GatewayEvents
from gateway.worker.drainer import Drainer
from gateway.worker.handoff import find_target, hand_to
from gateway.worker.recovery import DeadWorkers, delivered_tokens, resumed_submit
from gateway.worker.step_budget import StepBudget
from gateway.worker.stop_ends import DRAINED_ERROR, STOPPED_ERROR, stop_end
from gateway.worker.tier_status import TierStatusPublisher
from gateway.worker.upkeep import DEAD_CHECK_S, Upkeep
from gateway.worker.writer import Inflight, OutputWriter, inflight_record
from policies.tiers import INTERACTIVE, TIERS

log = logging.getLogger("carpool.worker")

LOST_ERROR = "worker lost mid-generation; partial output was already streamed"
STOP_TIMEOUT_S = 5.0  # for the ends of the requests in flight to be written at stop


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(self, redis: Any, engine: EngineClient, config: GatewayConfig,
                 events: GatewayEvents | None = None) -> None:
        self.redis = redis
        self.engine = engine
        self.config = config
        self.events = events or GatewayEvents()
        self.keys = RedisKeys(config.namespace)
        self.consumer = config.worker_id or default_worker_id()
        self.queues = TierQueues(redis, self.keys, TIERS, config.placement_wait_ms)
        self.writer = OutputWriter(redis, self.keys, config.stream_ttl_s,
                                   config.usage_retention_days * 86400 if config.ledger else 0)
        self.drainer = Drainer(self.queues, engine, self.consumer, config.tier_weights, self._start,
                               row_limit=lambda: self.step_budget.row_limit, held=self._held,
                               owed_rows=lambda urgent: self.step_budget.owed_lower_rows(urgent),
                               steps_done=lambda: engine.stats().steps_done)
        self.inflight: dict[str, Inflight] = {}
        self.step_budget = StepBudget(engine, config.tier_slos[INTERACTIVE],
                                      tier_weights=config.tier_weights)
        self.step_budget.urgent_rows = lambda: sum(
            rec.tier == INTERACTIVE for rec in self.inflight.values())
        self.step_budget.lower_held = lambda: sum(
            rec.tier != INTERACTIVE for rec in self.inflight.values())
        self.step_budget.lower_ttft_s = min(
            (s.ttft_p99_s for t, s in config.tier_slos.items()
             if t != INTERACTIVE and s.ttft_p99_s is not None), default=None)
        self.tier_status = TierStatusPublisher(redis, self.keys, self.queues, config,
                                               self.consumer, self.step_budget)
        self.dead_workers = DeadWorkers(self.consumer)
        self.draining = False  # set by ``drain``: no new work, published in the tier status
        self.tier_status.draining = lambda: self.draining
        self.tier_status.running = lambda: len(self.inflight)
        self.upkeep = Upkeep(redis, self.keys, self.queues, self.consumer, self.dead_workers,
                             self._start, lambda: list(self.inflight.values()),
                             lambda: self.draining)
        self._takeovers: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._pubsub: Any = None
        self._listen_redis: Any = None  # the cancel listener's client: no read timeout

    async def start(self) -> None:
        await self.engine.start()
        self.engine.add_step_callback(self._on_step)
        self.step_budget.attach()
        # no read timeout: the request path's would break the wait for a cancel every few s
        self._listen_redis = blocking_client(self.redis)
        self._pubsub = self._listen_redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(self.keys.cancel_channel)
        await self.queues.pending.seed()  # entries picked before the index existed
        for coro, name in ((self.writer.run(), "writer"), (self.drainer.run(), "drainer"),
                           (run_forever(self._cancel_step, "cancel listener", log), "cancels"),
                           (run_forever(self._maintain, "maintenance", log), "maintenance"),
                           (run_forever(self._claim_dead, "dead-worker check", log), "dead"),
                           (self.step_budget.run(), "step-budget"),
                           (self.tier_status.run(), "tier-status")):
            task = asyncio.create_task(coro, name=f"worker-{name}")
            task.add_done_callback(_report_crash)
            self._tasks.append(task)

    async def drain(self, deadline_s: float, now: asyncio.Event | None = None) -> None:
        """A stop that breaks no stream: take no new work from now on (the drainer stops;
        no reclaims, no take-overs), let the requests in flight finish for up to
        ``deadline_s``, or until ``now`` is set (a second SIGTERM), then hand what is left
        to another worker (``_end_inflight``). ``stop`` comes after it."""
        self.draining = True
        drainer = [t for t in self._tasks if t.get_name() == "worker-drainer"]
        await stop_tasks(drainer, log)
        self._tasks = [t for t in self._tasks if t not in drainer]
        with contextlib.suppress(RedisError, OSError, TimeoutError):  # no hand-offs to us now
            await self.tier_status.publish()
        log.info("draining: %d request(s) in flight, deadline %.0f s",
                 len(self.inflight), deadline_s)
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while self.inflight and loop.time() < end and not (now is not None and now.is_set()):
            await asyncio.sleep(0.02)
        if self.inflight:
            target = await self._handoff_target()  # they run on while it is looked for
            await self._end_inflight(hand_off=True, target=target)

    async def stop(self) -> None:
        writer = [t for t in self._tasks if t.get_name() == "worker-writer"]
        await stop_tasks([t for t in self._tasks if t not in writer], log)  # no new work first
        await stop_tasks(list(self._takeovers), log)
        await self._end_inflight()  # the writer still runs: it writes their ends
        await stop_tasks(writer, log)
        self._tasks.clear()
        self.step_budget.detach()
        with contextlib.suppress(Exception):  # readers also drop it once stale
            await self.tier_status.withdraw()
        with contextlib.suppress(Exception):  # else the groups keep it: a cost, not a loss
            await self.upkeep.depart(self.consumer)
        await self.writer.close()
        await self.queues.close()
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        if self._listen_redis is not None:
            with contextlib.suppress(Exception):
                await self._listen_redis.aclose()

    async def _end_inflight(self, hand_off: bool = False, target: str | None = None) -> None:
        """Abort every request this worker runs and end each as Redis says of it: the three
        cases and the hand-off are in ``stop_ends.py``."""
        recs = [rec for rec in self.inflight.values() if rec.owned]
        self.inflight.clear()
        for rec in recs:
            self.engine.abort(rec.request_id)
        if not recs or not self._tasks:
            return
        try:
            error = STOPPED_ERROR if not hand_off else DRAINED_ERROR
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await self._writer_idle()  # outputs already produced are in: 'sent' is exact
                marks = await self.queues.execute(
                    [("HMGET", self.keys.req(rec.request_id, rec.tenant), "sent", "cancel")
                     for rec in recs])
                self.writer.submit([
                    end for rec, (sent, cancel) in zip(recs, marks, strict=True)
                    if (end := stop_end(rec, sent if target is None else None, cancel, error))
                    is not None])
                await self._writer_idle()
            if target is not None:
                await self._hand_to(target, len(recs))
            elif hand_off:
                log.warning("drain deadline passed with %d request(s) in flight and no other "
                            "live worker: their streams end with an error", len(recs))
        except (RedisError, OSError, TimeoutError) as exc:  # the entries stay pending,
            # reclaimed as a dead worker's; one line, not a traceback, on a stop
            log.warning("could not end the requests in flight at stop: %r", exc)

    async def _handoff_target(self) -> str | None:
        return await find_target(self.redis, self.keys, self.dead_workers, self.consumer,
                                 busy=lambda: bool(self.inflight))

    async def _hand_to(self, target: str, n: int) -> None:
        log.warning("handing %d request(s) to worker %s", n, target)
        await hand_to(self.redis, self.keys, self.queues, self.consumer, target)

    async def _take_over(self, source: str) -> None:
        """Run every entry ``source`` holds (its ``HandoffMsg``): as a dead worker's."""
        envs = await self.queues.claim_from(None, source, self.consumer, 0)
        if envs:
            await self._start(envs, reclaim=True)

    async def _writer_idle(self) -> None:
        while not self.writer.idle:
            await asyncio.sleep(0.005)

    # -- engine side ----------------------------------------------------------------------

    def _on_step(self, outputs: list[RequestOutput]) -> None:
        items = []
        for out in outputs:
            rec = self.inflight.get(out.request_id)
            if rec is None:
                continue
            items.append((rec, out))
            if out.finished:
                del self.inflight[out.request_id]
                # what interactive asks, for the step budget (a cancelled one says little)
                if rec.tier == INTERACTIVE and out.finish_reason in COMPLETED:
                    self.step_budget.demand.finished(out.num_output_tokens)
        self.writer.submit(items)
        self.drainer.room.set()
        self.events.engine_step(len(outputs), self.engine.load(), outputs)

    def _held(self) -> list[tuple[str, str, float]]:
        """(tier, tenant, weight) of each request held: the drainer's tenant seat shares."""
        return [(rec.tier, rec.tenant, rec.weight) for rec in self.inflight.values()]

    async def _start(self, envs: list[Envelope], reclaim: bool = False) -> None:
        """Run a batch of envelopes, or drop them (cancelled, past deadline, lost) and ack
        them: one pipelined claim round trip and one for the acks and cancel checks."""
        if reclaim:  # not the drainer's read: a reclaimed request sends no TTFT marks
            self.drainer.read_at = (0.0, 0)
        todo: list[Envelope] = []
        taken: set[str] = set()  # request ids in todo
        cmds: list[tuple[Any, ...]] = []
        for env in envs:
            if env.msg is None:  # deleted by a cancel before we read it
                cmds += self.queues.done_commands(env)
            elif env.msg.request_id in self.inflight:
                continue  # ours already (a reclaim of what we run): its finish acks it
            elif env.msg.request_id in taken:
                cmds += self.queues.done_commands(env)  # a second entry
            else:
                todo.append(env)
                taken.add(env.msg.request_id)
        early: dict[int, Inflight] = {}  # position in todo -> started before its claim
        try:
            if not reclaim:
                self._start_early(todo, early)
            statuses = await self.queues.claim_many(
                [(e.msg.request_id, e.msg.tenant_id) for e in todo if e.msg is not None],
                self.consumer, reclaim)
            for i, rec in early.items():
                self._resolve_claim(rec, statuses[i])
        finally:  # whatever failed, no early claim is left open: the writer would wait on it
            for rec in early.values():
                self._resolve_claim(rec, "unclaimed")  # the entry stays pending: reclaimed
        started: list[tuple[str, int]] = []  # (request id, index of its HGET in cmds)
        lost: list[tuple[Inflight, SubmitMsg]] = []
        for i, (env, status) in enumerate(zip(todo, statuses, strict=True)):
            msg = env.msg
            assert msg is not None
            if status == "run" and i in early:
                # In ``inflight`` since before the claim: a cancel that comes after the claim
                # finds it through its publish, so no mark lookup is needed for it.
                continue
            rec = inflight_record(env, msg)
            if status == "run" and time.time() > msg.deadline_unix > 0:
                self._finish_now(rec, msg, FinishReason.ERROR,
                                 "deadline exceeded before the request started")
            elif status == "run" and (refused := self._run(rec, msg)) is not None:
                self._finish_now(rec, msg, FinishReason.ERROR, refused)
            elif status == "run":
                started.append((msg.request_id, len(cmds)))
                cmds.append(("HGET", self.keys.req(msg.request_id, msg.tenant_id), "cancel"))
            elif status == "lost":  # its dead worker had streamed output: resume it
                lost.append((rec, msg))
            elif status == "abort":
                self._finish_now(rec, msg, FinishReason.ABORT, "cancelled")
            else:  # cancelled / finished / gone: whoever cancelled it told the reader
                cmds += self.queues.done_commands(env)
                self.events.dropped(msg.request_id, status)
        results = await self.queues.execute(cmds)
        for rid, at in started:
            mark = results[at]
            if mark is not None:  # a cancel raced our claim: its publish found no owner
                self._cancel(CancelMsg(rid, reader_gone=mark in (b"gone", "gone")))
        if lost:
            await self._migrate(lost)

    async def _migrate(self, lost: list[tuple[Inflight, SubmitMsg]]) -> None:
        """Resume requests whose dead worker had streamed output (``recovery.py``), from
        what their output streams hold, read in one round trip with their cancel marks; one
        that cannot be resumed ends with the worker-lost error, as before."""
        cmds: list[tuple[Any, ...]] = []
        for _, msg in lost:
            cmds += [("XRANGE", self.keys.out(msg.request_id, msg.tenant_id), "-", "+"),
                     ("HGET", self.keys.req(msg.request_id, msg.tenant_id), "cancel")]
        replies = await self.queues.execute(cmds)
        for i, (rec, msg) in enumerate(lost):
            entries, cancel = replies[2 * i], replies[2 * i + 1]
            delivered = delivered_tokens(entries)
            resumed = resumed_submit(msg, delivered) if delivered is not None else None
            if cancel is not None:  # cancelled since our claim
                self._finish_now(rec, msg, FinishReason.ABORT, "cancelled")
            elif resumed is None or delivered is None:
                self._finish_now(rec, msg, FinishReason.ERROR, LOST_ERROR)
            else:
                rec.offset_base, rec.first_sent = len(delivered), True
                self._resume(rec, resumed)

    def _resume(self, rec: Inflight, msg: SubmitMsg) -> None:
        if time.time() > msg.deadline_unix > 0:
            self._finish_now(rec, msg, FinishReason.ERROR,
                             "deadline exceeded before the request could resume")
        elif msg.max_tokens <= 0:  # every token was delivered: only the finish was lost
            self.writer.submit([(rec, RequestOutput(rec.request_id, [], "", True,
                                                    FinishReason.LENGTH,
                                                    len(msg.prompt_token_ids), 0))])
        elif (refused := self._run(rec, msg)) is not None:
            self._finish_now(rec, msg, FinishReason.ERROR, refused)
        else:
            log.warning("resumed %s after %d delivered tokens: its worker stopped or died",
                        rec.request_id, rec.offset_base)

    def _start_early(self, todo: list[Envelope], early: dict[int, Inflight]) -> None:
        """Hand fresh entries to the engine before their claim answers (it almost always says
        "run"), recording them in ``early`` as they go: the claim's round trip then overlaps
        the engine's first step instead of delaying it, on every request's path. The writer
        holds a request's outputs until its claim has answered and drops them unless it said
        "run" (``_resolve_claim``). Entries past their deadline, or that the engine refuses,
        wait for the claim as before."""
        loop = asyncio.get_running_loop()
        for i, env in enumerate(todo):
            msg = env.msg
            assert msg is not None
            if time.time() > msg.deadline_unix > 0:
                continue
            rec = inflight_record(env, msg, claim=loop.create_future())
            if self._run(rec, msg) is None:
                early[i] = rec

    def _resolve_claim(self, rec: Inflight, status: str) -> None:
        """Tell the writer what the claim of an early-started request said (the first answer
        counts); one that is not ours to run (cancelled while queued, gone, a failed claim)
        is stopped in the engine, which frees its KV at its next step, and nothing it
        produced is written."""
        assert rec.claim is not None
        if rec.claim.done():
            return
        rec.claim.set_result(status)
        if status != "run":
            self.engine.abort(rec.request_id)

    def _run(self, rec: Inflight, msg: SubmitMsg) -> str | None:
        """Hand the request to the engine; returns why the engine refused it, if it did (a
        prompt this model can't embed, e.g. from a gateway serving another model). Raising
        here instead would strand the rest of the batch and redeliver the bad entry forever."""
        self.inflight[rec.request_id] = rec
        try:
            self.engine.add_request(
                rec.request_id, msg.prompt_token_ids, msg.sampling_params(), msg.priority,
                first_token_urgent=self.drainer.first_token_urgent(rec.tier, rec.tenant))
        except BaseException as exc:
            if self.inflight.get(rec.request_id) is rec:
                del self.inflight[rec.request_id]
            if isinstance(exc, ValueError):
                return str(exc)
            raise
        rec.read_unix, rec.read_steps = self.drainer.read_at  # for the first token's marks
        rec.posted_unix = now = time.time()
        wait = max(0.0, now - msg.arrival_unix) if msg.arrival_unix else 0.0
        rec.queue_wait_s = wait  # the FinishMsg carries it to the gateway's request span
        self.tier_status.record_start(rec.tier)
        if rec.tier == INTERACTIVE:
            self.step_budget.demand.started(len(msg.prompt_token_ids))
        self.events.dispatched(rec.tier, rec.request_id, wait, traceparent=msg.traceparent)
        return None

    def _finish_now(self, rec: Inflight, msg: SubmitMsg, reason: FinishReason,
                    error: str) -> None:
        out = RequestOutput(rec.request_id, [], "", True, reason, len(msg.prompt_token_ids), 0,
                            error=error)
        self.writer.submit([(rec, out)])
        self.events.dropped(rec.request_id, error)

    # -- cancellation ---------------------------------------------------------------------

    async def _cancel_step(self) -> None:
        """Handle the next message on the cancel channel (blocks until one arrives)."""
        message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
        if message is None or message.get("type") != "message":
            return
        try:
            msg = decode_payload(message["data"])
        except MessageError:
            return
        if isinstance(msg, CancelMsg):
            self._cancel(msg)
        elif isinstance(msg, HandoffMsg) and msg.target == self.consumer and not self.draining:
            task = asyncio.create_task(self._take_over(msg.source), name="worker-take-over")
            task.add_done_callback(_report_crash)
            task.add_done_callback(self._takeovers.discard)
            self._takeovers.add(task)

    def _cancel(self, msg: CancelMsg) -> None:
        rec = self.inflight.get(msg.request_id)
        if rec is not None:
            rec.reader_gone = rec.reader_gone or msg.reader_gone
            self.engine.abort(msg.request_id)

    # -- liveness -------------------------------------------------------------------------

    async def _maintain(self) -> None:
        """One maintenance round (``upkeep.py``), a third of the visibility timeout after
        the last."""
        await asyncio.sleep(self.config.visibility_timeout_s / 3)
        await self.upkeep.maintain(self.config.visibility_timeout_s)

    async def _claim_dead(self) -> None:
        """One check for dead workers (``upkeep.py``) every ``DEAD_CHECK_S``."""
        await asyncio.sleep(DEAD_CHECK_S)
        await self.upkeep.claim_dead()


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("worker task %s crashed", task.get_name(), exc_info=task.exception())
