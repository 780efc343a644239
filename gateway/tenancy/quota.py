"""Tenant quotas enforced atomically in Redis, so they hold across gateway replicas.

``admit`` is one Lua script, one round trip: queue length, concurrency, requests/minute and
tokens/minute are checked together against the server clock (``TIME``) and, only if all pass,
the buckets are charged, a concurrency lease is taken, the envelope is appended to the
tenant's stream in its tier (with the tenant's fair-queue weight) and the request's ownership record is written (``QueueEntries.admit`` in
``bus/queues.py``, the owner of queue entries). ``settle`` returns the unused token reservation
and the lease and writes the request's usage ledger row (``tenancy/ledger.py``) in the same
call; it is idempotent (the ZREM of the lease decides), so the gateway may call it from every
exit path and the ledger counts each request once. A settle that Redis did not answer (an
outage) is retried in the background, with backoff, until Redis answers or its lease would
have expired: a request that ended during an outage is still refunded and in the ledger. The bucket math mirrors ``policies/rate_limit.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import RedisError

from gateway.bus.backoff import Backoff
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import SubmitMsg
from gateway.bus.queues import BudgetCheck, QueueEntries
from gateway.bus.resp import LuaScript, RespConnection
from gateway.bus.scripts import SETTLE_LUA
from gateway.tenancy.ledger import LedgerEntry, ledger_ttl
from gateway.tenancy.tenants import Tenant
from policies.budget import Price, charge, period_window
from policies.rate_limit import ratelimit_headers

log = logging.getLogger("carpool.gateway")
MAX_PENDING_SETTLES = 10_000

LIMIT_MESSAGES = {
    "queue_full": "the {tier} queue is full",
    "concurrency": "too many concurrent requests for this tenant (max {max_concurrency})",
    "rpm": "requests per minute limit reached ({rpm}/min)",
    "tpm": "tokens per minute limit reached ({tpm}/min; this request reserves {cost})",
    "budget_exceeded": "this tenant's {period} budget ({budget}) is spent; it resets at {reset}",
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
    # the budget charged (its period's key, the reservation's charge), for the settle
    budget_key: str = ""
    budget_charge: int = 0


class QuotaEnforcer:
    def __init__(self, redis: Any, keys: RedisKeys, queue_max_len: int, lease_ms: int,
                 req_ttl_s: int, ledger_retention_s: int = 0, price: Price | None = None) -> None:
        self.keys = keys
        self.price = price  # the model's, for the ledger's cost and cost budgets
        self.ledger_retention_s = ledger_retention_s  # 0: the ledger is off
        self.queue_max_len = queue_max_len
        self.lease_ms = lease_ms
        self.req_ttl_s = req_ttl_s
        # Both calls are on every request's path: one lean connection (``resp.py``) that
        # concurrent requests share (their calls are pipelined on it).
        self._conn = RespConnection.for_client(redis)
        self._entries = QueueEntries(redis, keys, self._conn)
        self._settle = LuaScript(redis, self._conn, SETTLE_LUA)
        self._retries: set[asyncio.Task[None]] = set()  # settles waiting for Redis

    async def close(self) -> None:
        for task in list(self._retries):
            task.cancel()
        await asyncio.gather(*self._retries, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()

    def _retry(self, keys: list[str], args: list[Any]) -> None:
        """Run a settle Redis did not answer again until it does (the script is idempotent)
        or the request's lease would have expired; at most ``MAX_PENDING_SETTLES`` wait."""
        if len(self._retries) >= MAX_PENDING_SETTLES:
            log.warning("%d settles already wait for Redis: one more is dropped",
                        len(self._retries))
            return

        async def again() -> None:
            deadline, backoff = time.monotonic() + self.lease_ms / 1000, Backoff(0.1, 2.0)
            while time.monotonic() < deadline:
                await asyncio.sleep(backoff.next_delay())
                try:
                    await self._settle(keys=keys, args=args)
                    return
                except (RedisError, OSError, TimeoutError):
                    continue

        task = asyncio.get_running_loop().create_task(again())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def admit(self, tenant: Tenant, msg: SubmitMsg, cost: int,
                    prefer: str = "") -> Admission:
        """Check every limit and enqueue ``msg`` atomically; ``cost`` = prompt + max_tokens;
        ``prefer``: the worker that should take it first (placement; '' = any)."""
        q = tenant.quota
        budget, check = q.budget, None
        if budget.limit:
            now = time.time()
            period, ends = period_window(budget.period, now)
            n_prompt = len(msg.prompt_token_ids)
            check = BudgetCheck(self.keys.budget(tenant.id, period), budget.limit,
                                charge(budget, self.price, n_prompt, 0, cost - n_prompt),
                                max(1, math.ceil(ends - now)))
        status, detail, rpm_level, tpm_level = await self._entries.admit(
            msg, tenant.id, rpm=q.rpm, tpm=q.tpm, max_concurrency=q.max_concurrency,
            queue_max_len=self.queue_max_len, cost=cost, lease_ms=self.lease_ms,
            req_ttl_s=self.req_ttl_s, weight=tenant.weight, budget=check, prefer=prefer)
        headers = tuple(ratelimit_headers(q.rpm, rpm_level, q.tpm, tpm_level))
        if status == "ok":
            return Admission(True, entry_id=detail, headers=headers,
                             budget_key=check.key if check else "",
                             budget_charge=check.charge if check else 0)
        text = LIMIT_MESSAGES[status].format(
            tier=msg.tier, max_concurrency=q.max_concurrency, rpm=q.rpm, tpm=q.tpm, cost=cost,
            period={"daily": "daily", "monthly": "monthly"}[budget.period],
            budget=f"{budget.tokens} tokens" if budget.tokens else f"{budget.cost:g}",
            reset=datetime.fromtimestamp(time.time() + int(detail), UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"))
        return Admission(False, status, int(detail), message=text, headers=headers)

    async def settle(self, tenant: Tenant, request_id: str, reserved: int, actual: int,
                     outcome: str, delete_key: str | None = None,
                     usage: LedgerEntry | None = None, budget_key: str = "",
                     budget_charge: int = 0) -> bool:
        """Release the lease, refund ``reserved - actual`` tokens, add ``usage`` to the
        ledger and replace the budget's reservation charge (``budget_charge`` on
        ``budget_key``, from the admission) with what ``usage`` delivered; True the first
        time. ``delete_key`` (the output stream, once read to its end) is deleted in the same
        call."""
        k = self.keys
        on = usage is not None and self.ledger_retention_s > 0
        keys = [k.bucket(tenant.id, "tpm"), k.concurrency(tenant.id), k.tenant_stats(tenant.id),
                k.usage(tenant.id, usage.hour if usage else "-"),
                k.usage_tenants(k.shard_of(tenant.id)),
                budget_key or k.budget(tenant.id, "-")]
        args: list[Any] = [tenant.quota.tpm, reserved, actual, request_id, outcome]
        u = usage or LedgerEntry("", "", 0, 0, 0)
        cost = self.price.cost_micro(u.prompt_tokens, u.cached_tokens, u.completion_tokens) \
            if self.price else ""
        args += [u.prefix if on else "", ledger_ttl(self.ledger_retention_s), tenant.id,
                 u.prompt_tokens,
                 u.cached_tokens, u.completion_tokens, u.error, cost]
        if budget_key:
            args += [budget_charge, charge(tenant.quota.budget, self.price, u.prompt_tokens,
                                           u.cached_tokens, u.completion_tokens)]
        else:
            args += ["", ""]
        keys += [delete_key] if delete_key else []
        try:
            res = await self._settle(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError, asyncio.CancelledError):
            self._retry(keys, args)  # not answered (or its wait was cut short): again later
            raise
        return bool(res)
