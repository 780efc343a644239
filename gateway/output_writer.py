"""Per-step output path: one pipelined Redis round trip for every output of an engine step.

The engine calls the worker's step callback on the event loop with all outputs of a step; the
writer turns them into ``TokenMsg``/``FinishMsg`` entries on ``out:{id}`` in one pipeline
(coalescing steps that queued up while a write was in flight). A finished request's queue
entry is acknowledged in the same pipeline — entries are acked only once finished. When the
reader is gone (client disconnected, deadline), its stream is deleted instead of written.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from engine.outputs import RequestOutput
from gateway.backoff import run_forever
from gateway.messages import FinishMsg, TokenMsg, encode
from gateway.queues import TierQueues
from gateway.redis_keys import RedisKeys

log = logging.getLogger("carpool.worker")

# KEYS: req, out;  ARGV: finish type, finish data, ttl.  The final write and the state change
# are one step against the cancel script (``cancel.py``): a reader that left before the finish
# was written (its cancel mark is 'gone') gets its stream deleted, not recreated until the TTL.
FINISH_LUA = """
if redis.call('HGET', KEYS[1], 'cancel') == 'gone' then
  redis.call('DEL', KEYS[2])
else
  redis.call('XADD', KEYS[2], '*', 't', ARGV[1], 'd', ARGV[2])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
end
redis.call('HSET', KEYS[1], 'state', 'finished')
"""


@dataclass
class Inflight:
    """A request this worker holds (in the engine or being dropped)."""

    request_id: str
    tier: str
    entry_id: str
    reader_gone: bool = False  # set by a cancel whose reader left
    queue_wait_s: float | None = None  # enqueue -> taken by this worker (for the FinishMsg)


class OutputWriter:
    def __init__(self, redis: Any, keys: RedisKeys, queues: TierQueues, stream_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.queues = queues
        self.ttl = stream_ttl_s
        self._queue: asyncio.Queue[list[tuple[Inflight, RequestOutput]]] = asyncio.Queue()
        self.writes = 0  # pipelines executed (one per step when keeping up)
        self._retry: list[tuple[Inflight, RequestOutput]] = []  # a batch whose write failed
        self._finish_script = redis.register_script(FINISH_LUA)

    def submit(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        if items:
            self._queue.put_nowait(items)

    async def run(self) -> None:
        await run_forever(self._step, "output writer", log)

    async def _step(self) -> None:
        """One write. A failed batch is written again, ahead of newer outputs, at the next
        step (after the backoff): losing a finish would hang its reader until the deadline,
        while a repeat only happens if the failure came after Redis applied the pipeline."""
        items, self._retry = self._retry or await self._queue.get(), []
        while not self._queue.empty():  # coalesce steps produced during the last write
            items.extend(self._queue.get_nowait())
        try:
            await self._write(items)
        except Exception:
            self._retry = items
            raise

    async def flush(self) -> None:
        """Wait until everything submitted so far is written (tests, shutdown)."""
        while not self._queue.empty() or self._retry:
            await asyncio.sleep(0.005)

    async def _write(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for rec, outs in _by_request(items):
            key = self.keys.out(rec.request_id)
            last = outs[-1]
            if rec.reader_gone:
                if last.finished:
                    pipe.delete(key)
            else:
                # steps that queued up behind a slow write become one message per request
                ids = [t for o in outs for t in o.new_token_ids]
                text = "".join(o.text_delta for o in outs)
                if ids or text:
                    pipe.xadd(key, encode(TokenMsg(ids, text)))
                    pipe.expire(key, self.ttl)
                if last.finished:
                    fin = encode(_finish(rec, last))
                    await self._finish_script(keys=[self.keys.req(rec.request_id), key],
                                              args=[fin["t"], fin["d"], self.ttl], client=pipe)
            if last.finished:
                pipe.hset(self.keys.req(rec.request_id), "state", "finished")
                await self.queues.done(rec.tier, rec.entry_id, pipe)
                pipe.hincrby(self.keys.stats, _outcome(last), 1)
        await pipe.execute()
        self.writes += 1


def _by_request(items: list[tuple[Inflight, RequestOutput]]
                ) -> list[tuple[Inflight, list[RequestOutput]]]:
    """Group outputs by request, keeping each request's order (dicts keep insertion order)."""
    groups: dict[str, tuple[Inflight, list[RequestOutput]]] = {}
    for rec, out in items:
        groups.setdefault(rec.request_id, (rec, []))[1].append(out)
    return list(groups.values())


def _finish(rec: Inflight, out: RequestOutput) -> FinishMsg:
    return FinishMsg(out.finish_reason or "stop", out.num_prompt_tokens, out.num_output_tokens,
                     out.error, queue_wait_s=rec.queue_wait_s,
                     num_preemptions=out.num_preemptions)


def _outcome(out: RequestOutput) -> str:
    reason = out.finish_reason or "stop"
    return {"abort": "aborted", "error": "errored"}.get(reason, "completed")
