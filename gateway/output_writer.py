"""Per-step output path: one pipelined Redis round trip for every output of an engine step.

The engine calls the worker's step callback on the event loop with all outputs of a step; the
writer turns them into ``TokenMsg``/``FinishMsg`` entries on ``out:{id}`` in one pipeline
(coalescing steps that queued up while a write was in flight). A finished request's queue
entry is acknowledged in the same pipeline — entries are acked only once finished. When the
reader is gone (client disconnected, deadline), its stream is deleted instead of written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine.outputs import RequestOutput
from gateway.messages import FinishMsg, TokenMsg, encode
from gateway.queues import TierQueues
from gateway.redis_keys import RedisKeys


@dataclass
class Inflight:
    """A request this worker holds (in the engine or being dropped)."""

    request_id: str
    tier: str
    entry_id: str
    reader_gone: bool = False  # set by a cancel whose reader left


class OutputWriter:
    def __init__(self, redis: Any, keys: RedisKeys, queues: TierQueues, stream_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.queues = queues
        self.ttl = stream_ttl_s
        self._queue: asyncio.Queue[list[tuple[Inflight, RequestOutput]]] = asyncio.Queue()
        self.writes = 0  # pipelines executed (one per step when keeping up)

    def submit(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        if items:
            self._queue.put_nowait(items)

    async def run(self) -> None:
        while True:
            items = await self._queue.get()
            while not self._queue.empty():  # coalesce steps produced during the last write
                items.extend(self._queue.get_nowait())
            await self._write(items)

    async def flush(self) -> None:
        """Wait until everything submitted so far is written (tests, shutdown)."""
        while not self._queue.empty():
            await asyncio.sleep(0.005)

    async def _write(self, items: list[tuple[Inflight, RequestOutput]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        touched: set[str] = set()
        for rec, out in items:
            key = self.keys.out(rec.request_id)
            if rec.reader_gone:
                if out.finished:
                    pipe.delete(key)
            else:
                if out.new_token_ids or out.text_delta:
                    pipe.xadd(key, encode(TokenMsg(list(out.new_token_ids), out.text_delta)))
                    touched.add(key)
                if out.finished:
                    pipe.xadd(key, encode(_finish(out)))
                    touched.add(key)
            if out.finished:
                pipe.hset(self.keys.req(rec.request_id), "state", "finished")
                await self.queues.done(rec.tier, rec.entry_id, pipe)
                pipe.hincrby(self.keys.stats, _outcome(out), 1)
        for key in touched:
            pipe.expire(key, self.ttl)
        await pipe.execute()
        self.writes += 1


def _finish(out: RequestOutput) -> FinishMsg:
    return FinishMsg(out.finish_reason or "stop", out.num_prompt_tokens, out.num_output_tokens,
                     out.error)


def _outcome(out: RequestOutput) -> str:
    reason = out.finish_reason or "stop"
    return {"abort": "aborted", "error": "errored"}.get(reason, "completed")
