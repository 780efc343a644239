"""The step script's keys and arguments for one engine step (``QueueEntries.write_step``), a
request at a time, split by shard: a script call touches one shard's keys (``keys.py``).

A shard whose part of the step finishes no request is written without the script: its token
writes are plain commands (an XADD per message; with ``refresh`` the stream's EXPIRE and the
request's 'sent' mark; with a charge the two HINCRBYFLOATs), which is what the script would
run for them. The script call itself was the largest share of a streamed token's Redis
commands (one per shard with outputs, every step), and only a finish needs its atomic step
(the state change against the cancel script, the ack, the counts)."""

from __future__ import annotations

from typing import Any

from engine.core.finish import FinishReason
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import FinishMsg, TokenMsg, encode, outcome

TOKEN_TYPE = encode(TokenMsg([], ""))["t"]
FINISH_TYPE = encode(FinishMsg(FinishReason.STOP, 0, 0))["t"]


class _Shard:
    """One shard's part of a step: the script's keys and arguments, the same writes as plain
    commands, and whether a request finishes there (then the script runs)."""

    __slots__ = ("args", "commands", "finishes", "keys")

    def __init__(self, keys: list[str], args: list[Any]) -> None:
        self.keys, self.args = keys, args
        self.commands: list[tuple[Any, ...]] = []
        self.finishes = False


class StepWrite:
    """One engine step's writes, grouped by shard."""

    __slots__ = ("_args", "_k", "_ledger", "_shards")

    def __init__(self, keys: RedisKeys, stream_ttl_s: int, ledger_ttl_s: int = 0) -> None:
        """``ledger_ttl_s``: the TTL a new ledger row's hash gets (``tenancy.ledger.ledger_ttl``;
        0: the ledger is off)."""
        self._k = keys
        # the stream TTL is refreshed once it fell below two thirds (not on every step)
        self._args: list[Any] = [stream_ttl_s, stream_ttl_s * 2 // 3, GROUP, TOKEN_TYPE,
                                 FINISH_TYPE, ledger_ttl_s]
        self._ledger = ledger_ttl_s > 0
        self._shards: dict[int, _Shard] = {}

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
            self._shards[shard] = _Shard([k.stats(shard), k.depth(shard), k.pending(shard)],
                                         list(self._args))
        part = self._shards[shard]
        hour, prefix = ledger if self._ledger and finish is not None else ("", "")
        req, out, vtc = k.req(request_id, tenant), k.out(request_id, tenant), k.vtc(tier, shard)
        data = encode(tokens)["d"] if tokens is not None else ""
        part.keys += [req, out, k.queue(tier, tenant), vtc,
                      k.usage(tenant, hour) if prefix and hour else k.stats(shard),
                      k.queue_tenants(tier, shard)]
        part.args += [1 if finish is not None else 0, 1 if reader_gone else 0, data,
                      encode(finish)["d"] if finish is not None else "",
                      entry_id, outcome(finish.finish_reason) if finish is not None else "",
                      tenant, repr(charge) if charge > 0 else "",
                      prefix if hour else "", finish.completion_tokens if finish else 0, tier,
                      1 if refresh else 0]
        part.finishes = part.finishes or finish is not None
        # the script's branch for a write that finishes nothing, as plain commands
        if not reader_gone and data:
            part.commands.append(("XADD", out, "*", "t", TOKEN_TYPE, "d", data))
            if refresh:
                part.commands += [("EXPIRE", out, self._args[0]), ("HSET", req, "sent", "1")]
        if charge > 0:
            part.commands += [("HINCRBYFLOAT", vtc, tenant, repr(charge)),
                              ("HINCRBYFLOAT", vtc, f":s:{tenant}", repr(charge))]

    def calls(self) -> list[tuple[list[str], list[Any]]]:
        """(keys, args) of each script call: one per shard where a request finishes."""
        return [(p.keys, p.args) for p in self._shards.values() if p.finishes]

    def commands(self) -> list[tuple[Any, ...]]:
        """The plain commands of the shards where no request finishes, in order (a request's
        messages keep theirs)."""
        return [c for p in self._shards.values() if not p.finishes for c in p.commands]

    @property
    def keys(self) -> list[str]:
        """Every key written (all shards'); for tests and logs."""
        return [key for p in self._shards.values() for key in p.keys]

    def __bool__(self) -> bool:
        return bool(self._shards)
