"""Every Redis key name Carpool uses, in one place, under a namespace prefix.

    {ns}:q:{tier}:{tenant}   stream  queued/running SubmitMsg envelopes (group "workers")
    {ns}:qt:{tier}           set     tenants that have a stream in the tier (reclaim, depth)
    {ns}:qa:{tier}           hash    tenant -> entries not yet picked (the backlogged tenants)
    {ns}:vtc:{tier}          hash    tenant -> virtual token counter; ":s:{tenant}" -> its service
                                     (never lifted: the pick's tie-break); ":last" -> last picked
    {ns}:wake:{tier}         list    a token per admission, for an idle drainer's BLPOP
    {ns}:wakew:{worker}:{tier} list  a token per admission that prefers this worker (placement)
    {ns}:out:{request}       stream  TokenMsg... FinishMsg; expires; deleted by its reader
    {ns}:req:{request}       hash    owner tenant, tier, state, queue entry id (BOLA checks)
    {ns}:cancel              channel CancelMsg, HandoffMsg to every worker
    {ns}:tenants             set     tenant ids
    {ns}:tenant:{id}         hash    quota fields
    {ns}:apikey:{digest}     hash    tenant, digest, name, created, expires, last_used (unix s;
                                     ``tenancy/key_info.py``); the key itself is never stored
    {ns}:tenant_keys:{id}    hash    key id -> digest (list/revoke)
    {ns}:admin_keys          set     digests of admin keys
    {ns}:admin_keys_ro       set     digests of read-only admin keys (GET /admin/* only)
    {ns}:rl:{id}:{kind}      hash    token bucket {level, ts} for rpm / tpm
    {ns}:conc:{id}           zset    in-flight request ids scored by lease expiry (ms)
    {ns}:usage:{id}:{hour}   hash    the usage ledger's tenant-hour (YYYYMMDDHH, UTC):
                                     "{key id}|{tier code}|{model id}|{metric}" -> count
                                     (``tenancy/ledger.py``); expires after the retention
    {ns}:usage_models        hash    model id -> model name (the ledger's fields)
    {ns}:usage_tenants       set     tenants that have ledger rows (deleted ones too)
    {ns}:budget:{id}:{period} string what the tenant spent in the period (d20261206 /
                                     m202612), in its budget's units (``policies/budget.py``)
    {ns}:audit               stream  admin actions, bounded (``tenancy/audit.py``)
    {ns}:stats               hash    counters (admitted, rejected:*, completed, aborted...)
    {ns}:tier_status         hash    worker id -> its tier status JSON (worker/tier_status.py)
    {ns}:metrics             hash    process id -> its metrics samples JSON (telemetry/stats_publish.py)
    {ns}:metrics:watch       string  set while someone reads the stats: processes publish only then
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "workers"


@dataclass(frozen=True)
class RedisKeys:
    ns: str = "carpool"

    def queue(self, tier: str, tenant: str) -> str:
        return f"{self.queue_prefix(tier)}{tenant}"

    def queue_prefix(self, tier: str) -> str:
        """A tier's tenant streams are this prefix + the tenant id (Lua builds them)."""
        return f"{self.ns}:q:{tier}:"

    def queue_tenants(self, tier: str) -> str:
        return f"{self.ns}:qt:{tier}"

    def backlogged(self, tier: str) -> str:
        return f"{self.ns}:qa:{tier}"

    def vtc(self, tier: str) -> str:
        return f"{self.ns}:vtc:{tier}"

    def wake(self, tier: str) -> str:
        return f"{self.ns}:wake:{tier}"

    def wake_worker(self, worker: str, tier: str) -> str:
        """The wake list of the admissions that prefer ``worker`` (prefix-aware placement);
        ends with the tier, as ``wake`` does (``TierQueues.wait`` reads it back)."""
        return f"{self.ns}:wakew:{worker}:{tier}"

    def out(self, request_id: str) -> str:
        return f"{self.ns}:out:{request_id}"

    def req(self, request_id: str) -> str:
        return f"{self.ns}:req:{request_id}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.ns}:cancel"

    @property
    def tenants(self) -> str:
        return f"{self.ns}:tenants"

    def tenant(self, tenant_id: str) -> str:
        return f"{self.ns}:tenant:{tenant_id}"

    def apikey(self, digest: str) -> str:
        return f"{self.ns}:apikey:{digest}"

    def tenant_keys(self, tenant_id: str) -> str:
        return f"{self.ns}:tenant_keys:{tenant_id}"

    @property
    def admin_keys(self) -> str:
        return f"{self.ns}:admin_keys"

    @property
    def admin_keys_read_only(self) -> str:
        return f"{self.ns}:admin_keys_ro"

    def bucket(self, tenant_id: str, kind: str) -> str:
        return f"{self.ns}:rl:{tenant_id}:{kind}"

    def concurrency(self, tenant_id: str) -> str:
        return f"{self.ns}:conc:{tenant_id}"

    def usage(self, tenant_id: str, hour: str) -> str:
        return f"{self.ns}:usage:{tenant_id}:{hour}"

    def budget(self, tenant_id: str, period_id: str) -> str:
        return f"{self.ns}:budget:{tenant_id}:{period_id}"

    @property
    def usage_models(self) -> str:
        return f"{self.ns}:usage_models"

    @property
    def audit(self) -> str:
        return f"{self.ns}:audit"

    @property
    def usage_tenants(self) -> str:
        return f"{self.ns}:usage_tenants"

    @property
    def stats(self) -> str:
        return f"{self.ns}:stats"

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
