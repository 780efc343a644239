"""Tenant quotas enforced atomically in Redis, so they hold across gateway replicas.

``admit`` is one Lua script, one round trip: queue length, concurrency, requests/minute and
tokens/minute are checked together against the server clock (``TIME``) and, only if all pass,
the buckets are charged, a concurrency lease is taken, the envelope is appended to the
tenant's stream in its tier (with the tenant's fair-queue weight) and the request's ownership record is written (``QueueEntries.admit`` in
``bus/queues.py``, the owner of queue entries). ``settle`` returns the unused token reservation
and the lease and writes the request's usage ledger row (``tenancy/ledger.py``) in the same
call; it is idempotent (the ZREM of the lease decides), so the gateway may call it from every
exit path and the ledger counts each request once. The bucket math mirrors ``policies/rate_limit.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.bus.keys import RedisKeys
from gateway.bus.messages import SubmitMsg
from gateway.bus.queues import QueueEntries
from gateway.bus.resp import LuaScript, RespConnection
from gateway.bus.scripts import SETTLE_LUA
from gateway.tenancy.ledger import LedgerEntry
from gateway.tenancy.tenants import Tenant
from policies.rate_limit import ratelimit_headers

LIMIT_MESSAGES = {
    "queue_full": "the {tier} queue is full",
    "concurrency": "too many concurrent requests for this tenant (max {max_concurrency})",
    "rpm": "requests per minute limit reached ({rpm}/min)",
    "tpm": "tokens per minute limit reached ({tpm}/min; this request reserves {cost})",
}


@dataclass(frozen=True)
class Admission:
    ok: bool
    reason: str = ""  # which limit when not ok
    retry_after_s: int = 0
    entry_id: str = ""
    message: str = ""
    # OpenAI's x-ratelimit-* headers, from the same call's bucket levels
    headers: tuple[tuple[str, str], ...] = ()


class QuotaEnforcer:
    def __init__(self, redis: Any, keys: RedisKeys, queue_max_len: int, lease_ms: int,
                 req_ttl_s: int, ledger_retention_s: int = 0) -> None:
        self.keys = keys
        self.ledger_retention_s = ledger_retention_s  # 0: the ledger is off
        self.queue_max_len = queue_max_len
        self.lease_ms = lease_ms
        self.req_ttl_s = req_ttl_s
        # Both calls are on every request's path: one lean connection (``resp.py``) that
        # concurrent requests share (their calls are pipelined on it).
        self._conn = RespConnection.for_client(redis)
        self._entries = QueueEntries(redis, keys, self._conn)
        self._settle = LuaScript(redis, self._conn, SETTLE_LUA)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def admit(self, tenant: Tenant, msg: SubmitMsg, cost: int) -> Admission:
        """Check every limit and enqueue ``msg`` atomically; ``cost`` = prompt + max_tokens."""
        q = tenant.quota
        status, detail, rpm_level, tpm_level = await self._entries.admit(
            msg, tenant.id, rpm=q.rpm, tpm=q.tpm, max_concurrency=q.max_concurrency,
            queue_max_len=self.queue_max_len, cost=cost, lease_ms=self.lease_ms,
            req_ttl_s=self.req_ttl_s, weight=tenant.weight)
        headers = tuple(ratelimit_headers(q.rpm, rpm_level, q.tpm, tpm_level))
        if status == "ok":
            return Admission(True, entry_id=detail, headers=headers)
        text = LIMIT_MESSAGES[status].format(
            tier=msg.tier, max_concurrency=q.max_concurrency, rpm=q.rpm, tpm=q.tpm, cost=cost)
        return Admission(False, status, int(detail), message=text, headers=headers)

    async def settle(self, tenant: Tenant, request_id: str, reserved: int, actual: int,
                     outcome: str, delete_key: str | None = None,
                     usage: LedgerEntry | None = None) -> bool:
        """Release the lease, refund ``reserved - actual`` tokens and add ``usage`` to the
        ledger; True the first time. ``delete_key`` (the output stream, once read to its
        end) is deleted in the same call."""
        k = self.keys
        on = usage is not None and self.ledger_retention_s > 0
        keys = [k.bucket(tenant.id, "tpm"), k.concurrency(tenant.id), k.stats,
                k.usage(tenant.id, usage.hour if usage else "-"), k.usage_tenants]
        args: list[Any] = [tenant.quota.tpm, reserved, actual, request_id, outcome]
        if on:
            assert usage is not None
            args += [usage.prefix, self.ledger_retention_s, tenant.id, usage.prompt_tokens,
                     usage.cached_tokens, usage.completion_tokens, usage.error]
        else:
            args += ["", 0, tenant.id, 0, 0, 0, ""]
        res = await self._settle(keys=keys + ([delete_key] if delete_key else []), args=args)
        return bool(res)
