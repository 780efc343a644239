"""One reader per gateway process for every in-flight request's output stream.

Instead of one blocking XREAD (and one Redis connection) per request, a single loop reads
every active ``out:{id}`` stream and hands each request its new entries. On one server that
is one blocking XREAD over every stream (keys of several hash slots are fine there), which
returns as soon as any of them moved: a read per step write, whatever the shards. A cluster
refuses a command over several slots, so there each shard (``bus/keys.py``) with open streams
has its own blocking XREAD in flight, and a round hands over the reads that returned, leaving
the others waiting: a shard costs a read per write to it, or per ``BLOCK_MS`` while it is
idle (an idle Valkey 9 cluster node holds a blocked read about 100 ms, whatever it asked),
never a busy poll. A stream registered in a shard with no read in flight starts one at once;
one registered where a read is in flight joins when that read returns. A failed read (Redis
away) is retried with a backoff and said once per outage (``bus/outage.py``); the streams
wait meanwhile, and those whose worker can still write finish once Redis is back.
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
        self._per_shard = _is_cluster(redis)
        self._reads: dict[str, asyncio.Future[Any]] = {}  # shard tag -> its read (cluster)
        self._joined: asyncio.Future[Any] | None = None  # a registration's wake (cluster)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="output-mux")

    async def stop(self) -> None:
        if self._task is not None:
            # Bounded: a cancel that lands on an in-flight redis-py read can be swallowed,
            # and shutdown must not hang on it.
            await stop_tasks([self._task], log)
            self._task = None
        for read in [*self._reads.values(), *([self._joined] if self._joined else [])]:
            read.cancel()
        self._reads.clear()
        self._joined = None
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
        """The entries of the streams that moved: ``[(key, [(id, fields), ...]), ...]``."""
        if not self._per_shard:
            return await self._read_group(list(self._streams), BLOCK_MS)
        groups: dict[str, list[str]] = {}
        for key in self._streams:
            groups.setdefault(_slot_tag(key), []).append(key)
        for tag, keys in groups.items():
            if tag not in self._reads:
                self._reads[tag] = asyncio.ensure_future(self._read_group(keys, BLOCK_MS))
        # a stream registered meanwhile, in a shard with no read in flight, starts one now
        # (cleared with the groups built: a registration since then sets it)
        if self._joined is None or self._joined.done():
            self._wake.clear()
            self._joined = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait([*self._reads.values(), self._joined],
                           return_when=asyncio.FIRST_COMPLETED)
        out: list[Any] = []
        for tag, read in list(self._reads.items()):
            if read.done():
                del self._reads[tag]
                out += read.result() or []
        return out

    async def _read_group(self, keys: list[str], block: int) -> Any:
        if self._per_shard:
            # the client's first call maps the slots (at once when mapped; a refresh after a
            # MOVED waits): a reader whose client made no call before would find none covered
            await self.redis.initialize()
        keys = [k for k in keys if k in self._streams]  # one may have left since
        if not keys:
            return []
        if self._per_shard:
            # routed by the first key's slot: redis-py's own routing would ask the server
            # COMMAND GETKEYS for every XREAD (a command per read); after a MOVED the client's
            # refreshed slot map routes the retry
            node = self.redis.get_node_from_key(keys[0])
            return await self.redis.execute_command(
                "XREAD", "COUNT", COUNT, "BLOCK", block, "STREAMS", *keys,
                *(self._streams[k].last for k in keys), target_nodes=node)
        if self._conn is None:
            return await self.redis.xread({k: self._streams[k].last for k in keys},
                                          count=COUNT, block=block)
        ids = [self._streams[k].last for k in keys]
        return await self._conn.call("XREAD", "COUNT", COUNT, "BLOCK", block, "STREAMS", *keys,
                                     *ids)


def _is_cluster(redis: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster

    return isinstance(redis, RedisCluster)


def _slot_tag(key: str) -> str:
    """The key's hash tag (what decides its slot), or the key itself without one."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1:end] if start >= 0 and end > start + 1 else key


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
