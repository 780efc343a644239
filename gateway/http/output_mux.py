"""One reader per gateway process for every in-flight request's output stream.

Instead of one blocking XREAD (and one Redis connection) per request, a single loop issues
one XREAD over all active ``out:{id}`` streams and hands each request its new entries. Under
load one round trip serves every stream that moved; a newly registered stream joins at the
next turn (the block is short, ``BLOCK_MS``). A failed read (Redis away) is retried with a
backoff and said once per outage (``bus/outage.py``); the streams wait meanwhile, and those
whose worker can still write finish once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.bus.backoff import Backoff, stop_tasks
from gateway.bus.messages import Message, MessageError, decode
from gateway.bus.outage import UNREACHABLE, ErrorOnce, OutageLog
from gateway.bus.resp import RespConnection

log = logging.getLogger("carpool.gateway")

BLOCK_MS = 2
COUNT = 1024


class _Stream:
    __slots__ = ("last", "queue")

    def __init__(self) -> None:
        self.last = "0-0"
        self.queue: asyncio.Queue[list[Message]] = asyncio.Queue()


class OutputMux:
    def __init__(self, redis: Any) -> None:
        self.redis = redis
        # its own lean connection (``resp.py``): one blocking read per engine step
        self._conn = RespConnection.for_client(redis)
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="output-mux")

    async def stop(self) -> None:
        if self._task is not None:
            # Bounded: a cancel that lands on an in-flight redis-py read can be swallowed,
            # and shutdown must not hang on it.
            await stop_tasks([self._task], log)
            self._task = None
        if self._conn is not None:
            await self._conn.close()

    def register(self, key: str) -> asyncio.Queue[list[Message]]:
        stream = self._streams.setdefault(key, _Stream())
        self._wake.set()
        return stream.queue

    def unregister(self, key: str) -> None:
        self._streams.pop(key, None)

    async def _run(self) -> None:
        backoff, outage, errors = Backoff(), OutageLog.of(log), ErrorOnce(log)
        while True:
            if not self._streams:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                res = await self._read()
            except UNREACHABLE as exc:  # keep serving: a Redis outage must not end every stream
                outage.failed("output reader", exc)
                await asyncio.sleep(backoff.next_delay())
                continue
            except Exception as exc:  # noqa: BLE001  (the reader every stream shares goes on)
                errors.failed("output reader", exc)
                await asyncio.sleep(backoff.next_delay())
                continue
            if backoff.delay:
                backoff.reset()
                errors.ok()
                outage.ok()
            for key, entries in res or []:
                stream = self._streams.get(key.decode() if isinstance(key, bytes) else key)
                if stream is None or not entries:
                    continue
                stream.last = entries[-1][0]
                msgs = _decode_all(key, entries)
                if msgs:
                    stream.queue.put_nowait(msgs)

    async def _read(self) -> Any:
        """One XREAD over every registered stream: ``[(key, [(id, fields), ...]), ...]``."""
        if self._conn is None:
            return await self.redis.xread({k: s.last for k, s in self._streams.items()},
                                          count=COUNT, block=BLOCK_MS)
        keys = list(self._streams)
        ids = [self._streams[k].last for k in keys]
        return await self._conn.call("XREAD", "COUNT", COUNT, "BLOCK", BLOCK_MS, "STREAMS",
                                     *keys, *ids)


def _decode_all(key: Any, entries: list[Any]) -> list[Message]:
    """The entries' messages; a malformed entry is logged and skipped so it cannot end the
    reader that every request of the process shares."""
    out = []
    for entry_id, fields in entries:
        if isinstance(fields, list):  # a raw reply: [field, value, field, value, ...]
            fields = dict(zip(fields[::2], fields[1::2]))
        try:
            out.append(decode(fields))
        except MessageError:
            log.exception("skipping malformed entry %r on %r", entry_id, key)
    return out
