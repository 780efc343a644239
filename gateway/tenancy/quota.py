"""Tenant quotas enforced atomically in Redis, so they hold across gateway replicas.

``admit`` is one Lua script, one round trip: queue length, concurrency, requests/minute and
tokens/minute are checked together against the server clock (``TIME``) and, only if all pass,
the buckets are charged, a concurrency lease is taken, the envelope is appended to the tier's
stream and the request's ownership record is written. ``settle`` returns the unused token
reservation and the lease; it is idempotent (the ZREM of the lease decides), so the gateway
may call it from every exit path. The bucket math mirrors ``policies/rate_limit.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.bus.keys import RedisKeys
from gateway.bus.messages import SubmitMsg, encode
from gateway.bus.resp import LuaScript, RespConnection
from gateway.tenancy.tenants import Tenant

_BUCKET_LUA = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function level_at(key, limit, now)
  local h = redis.call('HMGET', key, 'level', 'ts')
  if not h[1] then return limit end
  return math.min(limit, tonumber(h[1]) + math.max(0, now - tonumber(h[2])) * limit / 60000)
end
local function store(key, level, now)
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(now))
  redis.call('PEXPIRE', key, 120000)
end
"""

ADMIT_LUA = _BUCKET_LUA + """
-- KEYS: rpm, tpm, conc, queue, req, stats
-- ARGV: rpm, tpm, max_conc, queue_max, cost, request_id, lease_ms, type, data, tenant, tier, req_ttl_s
local now = now_ms()
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local maxc, qmax, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function reject(reason, retry)
  redis.call('HINCRBY', KEYS[6], 'rejected:' .. reason, 1)
  return {reason, retry}
end
if redis.call('XLEN', KEYS[4]) >= qmax then return reject('queue_full', 1) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if maxc > 0 and redis.call('ZCARD', KEYS[3]) >= maxc then return reject('concurrency', 1) end
local function retry_s(level, c, limit)
  return math.max(1, math.ceil((math.min(c, limit) - level) * 60000 / limit / 1000))
end
local lr, lt = 0, 0
if rpm > 0 then
  lr = level_at(KEYS[1], rpm, now)
  if lr < 1 then return reject('rpm', retry_s(lr, 1, rpm)) end
end
if tpm > 0 then
  lt = level_at(KEYS[2], tpm, now)
  if lt < cost then return reject('tpm', retry_s(lt, cost, tpm)) end
end
if rpm > 0 then store(KEYS[1], lr - 1, now) end
if tpm > 0 then store(KEYS[2], lt - cost, now) end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[7]), ARGV[6])
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
local id = redis.call('XADD', KEYS[4], '*', 't', ARGV[8], 'd', ARGV[9])
redis.call('HSET', KEYS[5], 'tenant', ARGV[10], 'tier', ARGV[11], 'state', 'queued',
  'queue', KEYS[4], 'entry', id, 'reserved', ARGV[5])
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[12]))
redis.call('HINCRBY', KEYS[6], 'admitted', 1)
return {'ok', id}
"""

SETTLE_LUA = _BUCKET_LUA + """
-- KEYS: tpm, conc, stats[, a key to delete: the finished request's output stream]
-- ARGV: tpm, reserved, actual, request_id, outcome
if KEYS[4] then redis.call('DEL', KEYS[4]) end
if redis.call('ZREM', KEYS[2], ARGV[4]) == 0 then return 0 end
local tpm = tonumber(ARGV[1])
if tpm > 0 then
  local now = now_ms()
  local refund = math.max(0, tonumber(ARGV[2]) - tonumber(ARGV[3]))
  store(KEYS[1], math.min(tpm, level_at(KEYS[1], tpm, now) + refund), now)
end
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
return 1
"""

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


class QuotaEnforcer:
    def __init__(self, redis: Any, keys: RedisKeys, queue_max_len: int, lease_ms: int,
                 req_ttl_s: int) -> None:
        self.keys = keys
        self.queue_max_len = queue_max_len
        self.lease_ms = lease_ms
        self.req_ttl_s = req_ttl_s
        # Both calls are on every request's path: one lean connection (``resp.py``) that
        # concurrent requests share (their calls are pipelined on it).
        self._conn = RespConnection.for_client(redis)
        self._admit = LuaScript(redis, self._conn, ADMIT_LUA)
        self._settle = LuaScript(redis, self._conn, SETTLE_LUA)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def admit(self, tenant: Tenant, msg: SubmitMsg, cost: int) -> Admission:
        """Check every limit and enqueue ``msg`` atomically; ``cost`` = prompt + max_tokens."""
        q, k = tenant.quota, self.keys
        fields = encode(msg)
        res = await self._admit(
            keys=[k.bucket(tenant.id, "rpm"), k.bucket(tenant.id, "tpm"),
                  k.concurrency(tenant.id), k.queue(msg.tier), k.req(msg.request_id), k.stats],
            args=[q.rpm, q.tpm, q.max_concurrency, self.queue_max_len, cost, msg.request_id,
                  self.lease_ms, fields["t"], fields["d"], tenant.id, msg.tier, self.req_ttl_s],
        )
        status = res[0].decode()
        if status == "ok":
            return Admission(True, entry_id=res[1].decode())
        text = LIMIT_MESSAGES[status].format(
            tier=msg.tier, max_concurrency=q.max_concurrency, rpm=q.rpm, tpm=q.tpm, cost=cost)
        return Admission(False, status, int(res[1]), message=text)

    async def settle(self, tenant: Tenant, request_id: str, reserved: int, actual: int,
                     outcome: str, delete_key: str | None = None) -> bool:
        """Release the lease and refund ``reserved - actual`` tokens; True the first time.
        ``delete_key`` (the output stream, once read to its end) is deleted in the same call."""
        k = self.keys
        keys = [k.bucket(tenant.id, "tpm"), k.concurrency(tenant.id), k.stats]
        res = await self._settle(
            keys=keys + ([delete_key] if delete_key else []),
            args=[tenant.quota.tpm, reserved, actual, request_id, outcome],
        )
        return bool(res)
