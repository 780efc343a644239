"""The step script's keys and arguments for one engine step (``QueueEntries.write_step``), a
request at a time, split by shard: a script call touches one shard's keys (``keys.py``)."""

from __future__ import annotations

from typing import Any

from engine.core.finish import FinishReason
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import FinishMsg, TokenMsg, encode, outcome

TOKEN_TYPE = encode(TokenMsg([], ""))["t"]
FINISH_TYPE = encode(FinishMsg(FinishReason.STOP, 0, 0))["t"]


class StepWrite:
    """One engine step's writes, grouped by shard."""

    __slots__ = ("_args", "_k", "_ledger", "_shards")

    def __init__(self, keys: RedisKeys, stream_ttl_s: int, ledger_retention_s: int = 0) -> None:
        self._k = keys
        # the stream TTL is refreshed once it fell below two thirds (not on every step)
        self._args: list[Any] = [stream_ttl_s, stream_ttl_s * 2 // 3, GROUP, TOKEN_TYPE,
                                 FINISH_TYPE, ledger_retention_s]
        self._ledger = ledger_retention_s > 0
        self._shards: dict[int, tuple[list[str], list[Any]]] = {}

    def add(self, request_id: str, tier: str, entry_id: str, reader_gone: bool,
            tokens: TokenMsg | None, finish: FinishMsg | None, *, tenant: str = "",
            charge: float = 0.0, ledger: tuple[str, str] = ("", ""),
            refresh: bool = True) -> None:
        """Write ``tokens`` (None: none) to the request's stream; with ``finish`` the
        request ends: the finish is written (or the stream deleted if ``reader_gone``), its
        outcome counted, and its queue entry (in ``tenant``'s stream) acknowledged and
        deleted. ``charge`` (output tokens / weight) is added to the tenant's counter.
        ``ledger``: the request's ledger row (hour, field prefix; '' = none), where the
        finish adds its completion tokens computed. ``refresh``: a token write (re)sets the
        stream's TTL and the request's 'sent' mark (the writer asks at the first write and
        then once a third of the TTL has passed)."""
        k = self._k
        shard = k.shard_of(tenant)
        if shard not in self._shards:
            self._shards[shard] = ([k.stats(shard), k.depth(shard), k.pending(shard)],
                                 list(self._args))
        keys, args = self._shards[shard]
        hour, prefix = ledger if self._ledger and finish is not None else ("", "")
        keys += [k.req(request_id, tenant), k.out(request_id, tenant), k.queue(tier, tenant),
                 k.vtc(tier, shard), k.usage(tenant, hour) if prefix and hour else k.stats(shard),
                 k.queue_tenants(tier, shard)]
        args += [1 if finish is not None else 0, 1 if reader_gone else 0,
                 encode(tokens)["d"] if tokens is not None else "",
                 encode(finish)["d"] if finish is not None else "",
                 entry_id, outcome(finish.finish_reason) if finish is not None else "",
                 tenant, repr(charge) if charge > 0 else "",
                 prefix if hour else "", finish.completion_tokens if finish else 0, tier,
                 1 if refresh else 0]

    def calls(self) -> list[tuple[list[str], list[Any]]]:
        """(keys, args) of each shard's script call."""
        return list(self._shards.values())

    @property
    def keys(self) -> list[str]:
        """Every key written (all shards'); for tests and logs."""
        return [key for keys, _ in self._shards.values() for key in keys]

    def __bool__(self) -> bool:
        return bool(self._shards)
