"""Every Redis key name Carpool uses, in one place, under a namespace prefix, laid out for
Redis Cluster: every script and transaction touches only keys of one hash slot.

A tenant belongs to one of ``shards`` shards (``shard_of``: CRC32 of its id); every key of the
tenant, of its requests and of the shard's part of each tier carries the shard's hash tag
``{T}`` (``SHARD_TAGS``, chosen so that 16 shards spread evenly over three masters' default
slot ranges), so admission, the fair pick, cancel, settle and a step's write each run in one
slot. ``docs/architecture.md`` ("Redis key layout") gives the reasons.

    {ns}:{T}:q:{tier}:{tenant}   stream  queued/running SubmitMsg envelopes (group "workers");
                                         bounded: the tier's queued + running entries are at
                                         most queue_max_len (admission), a finished or
                                         cancelled entry is deleted, an empty stream too
    {ns}:{T}:qt:{tier}           set     the shard's tenants that have a stream in the tier
    {ns}:{T}:qa:{tier}           hash    tenant -> entries not yet picked (backlogged tenants)
    {ns}:{T}:qp                  set     the pending index: "{tier}:{tenant}" of the shard's
                                         streams that hold picked, unacknowledged entries (at
                                         most one more member per stream emptied since the
                                         last reclaim round; ``bus/pending.py``)
    {ns}:{T}:qc:{worker}         set     "{tier}:{tenant}" of the shard's streams where the
                                         worker is a consumer (emptied at its departure)
    {ns}:{T}:qd                  hash    tier -> the shard's queued + running entries;
                                         "b:{tier}" -> its entries not yet picked
    {ns}:{T}:vtc:{tier}          hash    tenant -> virtual token counter; ":s:{tenant}" -> its
                                         service (the pick's tie-break); ":last" -> last picked
    {ns}:{T}:out:{request}       stream  TokenMsg... FinishMsg; bounded: one entry per step
                                         written (each >= 1 token) and the finish, so at most
                                         max_tokens + 1, never trimmed (a resumed request reads
                                         it back whole, ``worker/recovery.py``); expires (TTL
                                         from its first write); deleted by its reader
    {ns}:{T}:req:{request}       hash    owner tenant, tier, state, queue entry id (BOLA checks)
    {ns}:{T}:stats               hash    the shard's counters (admitted, rejected:*, completed...)
    {ns}:{T}:rl:{id}:{kind}      hash    token bucket {level, ts} for rpm / tpm
    {ns}:{T}:conc:{id}           zset    in-flight request ids scored by lease expiry (ms)
    {ns}:{T}:usage:{id}:{hour}   hash    the usage ledger's tenant-hour (YYYYMMDDHH, UTC):
                                         "{key id}|{tier code}|{model id}|{metric}" -> count
                                         (``tenancy/ledger.py``); expires at least the
                                         retention after its last write (``ledger_ttl``)
    {ns}:{T}:usage_tenants       set     the shard's tenants that have ledger rows
    {ns}:{T}:budget:{id}:{period} string what the tenant spent in the period (d20261206 /
                                         m202612), in its budget's units (``policies/budget.py``)
    {ns}:{wake.2}:wake:{tier}    list    a shard index per admission, for an idle drainer's
                                         BLPOP over its tiers (one slot for every tier)
    {ns}:{wake.2}:wakew:{worker}:{tier} list  a token per admission that prefers this worker
                                         (prefix-aware placement)
    {ns}:cancel                  channel CancelMsg, HandoffMsg to every worker
    {ns}:{dir}:tenants           set     tenant ids (the directory: one slot, so the
    {ns}:{dir}:tenant:{id}       hash    quota fields          tenancy transactions are too)
    {ns}:{dir}:apikey:{digest}   hash    tenant, digest, name, created, expires, last_used (unix
                                         s; ``tenancy/key_info.py``); the key is never stored
    {ns}:{dir}:tenant_keys:{id}  hash    key id -> digest (list/revoke)
    {ns}:{dir}:admin_keys        set     digests of admin keys
    {ns}:{dir}:admin_keys_ro     set     digests of read-only admin keys (GET /admin/* only)
    {ns}:usage_models            hash    model id -> model name (the ledger's fields)
    {ns}:audit                   stream  admin actions, bounded: XADD MAXLEN ~ max_len (10,000;
                                         ``tenancy/audit.py``)
    {ns}:tier_status             hash    worker id -> its tier status JSON (worker/tier_status.py);
                                         a worker's field goes at its departure
    {ns}:metrics                 hash    process id -> its metrics samples JSON
    {ns}:metrics:watch           string  set while someone reads the stats
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

GROUP = "workers"

# The shards' hash tags: shard i's slot (CRC16 of the tag mod 16384) lies in master i % 3's
# default slot range of a three-master cluster (0-5460, 5461-10922, 10923-16383), spread
# evenly inside it, so 16 shards put 6/5/5 on the masters (tests/gateway/bus/test_key_layout.py
# recomputes the slots).
SHARD_TAGS = ("s0.1081", "s1.803", "s2.2297", "s3.2661", "s4.1470", "s5.3636", "s6.3377",
              "s7.1766", "s8.3165", "s9.4383", "s10.2240", "s11.4917", "s12.3231", "s13.3493",
              "s14.1461", "s15.1161")
SHARDS = len(SHARD_TAGS)
# The wake lists' tag: its slot (15102) is in the third master's range, one of the two that
# hold 5 shards, not the 6 of the first (carpool bench redis: the busiest node's share)
WAKE_TAG = "wake.2"


@dataclass(frozen=True)
class RedisKeys:
    ns: str = "carpool"
    shards: int = SHARDS  # 1..16; every process of a deployment must use the same

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= SHARDS:
            raise ValueError(f"shards must be 1..{SHARDS}, not {self.shards}")

    # -- shards ------------------------------------------------------------------------------

    def shard_of(self, tenant: str) -> int:
        """The tenant's shard: stable across processes and restarts."""
        return zlib.crc32(tenant.encode()) % self.shards

    def tag(self, shard: int) -> str:
        """Shard ``shard``'s key prefix, hash tag included."""
        return f"{self.ns}:{{{SHARD_TAGS[shard]}}}"

    def _t(self, tenant: str) -> str:
        return self.tag(self.shard_of(tenant))

    def shard_range(self) -> range:
        return range(self.shards)

    # -- a tenant's queue and its shard's part of each tier ----------------------------------

    def queue(self, tier: str, tenant: str) -> str:
        return f"{self._t(tenant)}:q:{tier}:{tenant}"

    def queue_tenants(self, tier: str, shard: int) -> str:
        return f"{self.tag(shard)}:qt:{tier}"

    def backlogged(self, tier: str, shard: int) -> str:
        return f"{self.tag(shard)}:qa:{tier}"

    def pending(self, shard: int) -> str:
        return f"{self.tag(shard)}:qp"

    def consumed(self, worker: str, shard: int) -> str:
        return f"{self.tag(shard)}:qc:{worker}"

    def depth(self, shard: int) -> str:
        return f"{self.tag(shard)}:qd"

    def vtc(self, tier: str, shard: int) -> str:
        return f"{self.tag(shard)}:vtc:{tier}"

    def wake(self, tier: str) -> str:
        return f"{self.ns}:{{{WAKE_TAG}}}:wake:{tier}"

    def wake_worker(self, worker: str, tier: str) -> str:
        """The wake list of the admissions that prefer ``worker`` (prefix-aware placement);
        in the wake lists' slot, and ends with the tier, as ``wake`` does (``TierQueues.wait``
        blocks on both and reads the tier back)."""
        return f"{self.ns}:{{{WAKE_TAG}}}:wakew:{worker}:{tier}"

    # -- a request's keys: in its tenant's shard ---------------------------------------------

    def out(self, request_id: str, tenant: str) -> str:
        return f"{self._t(tenant)}:out:{request_id}"

    def req(self, request_id: str, tenant: str) -> str:
        return f"{self._t(tenant)}:req:{request_id}"

    def stats(self, shard: int) -> str:
        return f"{self.tag(shard)}:stats"

    def tenant_stats(self, tenant: str) -> str:
        return self.stats(self.shard_of(tenant))

    def bucket(self, tenant_id: str, kind: str) -> str:
        return f"{self._t(tenant_id)}:rl:{tenant_id}:{kind}"

    def concurrency(self, tenant_id: str) -> str:
        return f"{self._t(tenant_id)}:conc:{tenant_id}"

    def usage(self, tenant_id: str, hour: str) -> str:
        return f"{self._t(tenant_id)}:usage:{tenant_id}:{hour}"

    def budget(self, tenant_id: str, period_id: str) -> str:
        return f"{self._t(tenant_id)}:budget:{tenant_id}:{period_id}"

    def usage_tenants(self, shard: int) -> str:
        return f"{self.tag(shard)}:usage_tenants"

    # -- the tenant directory: one slot ------------------------------------------------------

    @property
    def _dir(self) -> str:
        return f"{self.ns}:{{dir}}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.ns}:cancel"

    @property
    def tenants(self) -> str:
        return f"{self._dir}:tenants"

    def tenant(self, tenant_id: str) -> str:
        return f"{self._dir}:tenant:{tenant_id}"

    def apikey(self, digest: str) -> str:
        return f"{self._dir}:apikey:{digest}"

    def tenant_keys(self, tenant_id: str) -> str:
        return f"{self._dir}:tenant_keys:{tenant_id}"

    @property
    def admin_keys(self) -> str:
        return f"{self._dir}:admin_keys"

    @property
    def admin_keys_read_only(self) -> str:
        return f"{self._dir}:admin_keys_ro"

    # -- single keys -------------------------------------------------------------------------

    @property
    def usage_models(self) -> str:
        return f"{self.ns}:usage_models"

    @property
    def audit(self) -> str:
        return f"{self.ns}:audit"

    @property
    def epoch(self) -> str:
        """Set by every gateway at start; its absence means Redis lost its data
        (``http/recovery.py``)."""
        return f"{self.ns}:epoch"

    @property
    def tier_status(self) -> str:
        return f"{self.ns}:tier_status"

    @property
    def metrics(self) -> str:
        return f"{self.ns}:metrics"

    @property
    def metrics_watch(self) -> str:
        return f"{self.ns}:metrics:watch"
