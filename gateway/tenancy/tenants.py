"""Tenants and their quotas: the data model, the tenants file, and the Redis store.

A limit of 0 means unlimited. ``weight`` (default 1, any number > 0) is the tenant's share
against the other tenants of a tier when both have requests queued (fair queuing,
``policies.fair_queue``): weight 2 gets twice the tokens of weight 1.

The store is the single source of truth at run time: the file
is loaded into it at start; admin endpoints and ``carpool tenants`` change it afterwards, and
every gateway sees the change on its next lookup (tenant records are cached < 1 s).
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.bus.keys import RedisKeys
from gateway.tenancy.key_info import (
    LAST_USED_EVERY_S,
    MAX_GRACE_S,
    KeyInfo,
    KeyLookup,
    check_key_fields,
)
from gateway.tenancy.keys import digests_match, generate_key, key_digest, key_id, looks_like_key
from policies.budget import Budget
from policies.tiers import INTERACTIVE, TIERS, normalize_tier

QUOTA_FIELDS = ("rpm", "tpm", "max_concurrency", "max_prompt_tokens", "max_max_tokens")
BUDGET_FIELDS = ("budget_tokens", "budget_cost", "budget_period")


@dataclass(frozen=True)
class TenantQuota:
    rpm: int = 0  # requests per minute
    tpm: int = 0  # prompt + completion tokens per minute
    max_concurrency: int = 0
    max_prompt_tokens: int = 0
    max_max_tokens: int = 0
    allowed_tiers: tuple[str, ...] = TIERS
    default_tier: str = INTERACTIVE
    # spend per period (``policies.budget``): tokens or cost (with a price for the model);
    # 0 = no budget
    budget_tokens: int = 0
    budget_cost: float = 0.0
    budget_period: str = "monthly"

    def __post_init__(self) -> None:
        Budget(self.budget_tokens, self.budget_cost, self.budget_period)  # validates
        for name in QUOTA_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 = unlimited), got {value!r}")
        tiers = tuple(_tier(t) for t in self.allowed_tiers)
        object.__setattr__(self, "allowed_tiers", tiers)
        object.__setattr__(self, "default_tier", _tier(self.default_tier))
        if not tiers:
            raise ValueError("allowed_tiers must not be empty")
        if self.default_tier not in tiers:
            raise ValueError(f"default_tier {self.default_tier!r} not in allowed_tiers {tiers}")

    @property
    def budget(self) -> Budget:
        return Budget(self.budget_tokens, self.budget_cost, self.budget_period)

    def with_changes(self, **changes: Any) -> TenantQuota:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str = ""
    quota: TenantQuota = field(default_factory=TenantQuota)
    weight: float = 1.0  # fair-queue share inside a tier

    def __post_init__(self) -> None:
        if not self.id or not all(c.isalnum() or c in "-_." for c in self.id):
            raise ValueError(f"tenant id must be non-empty [A-Za-z0-9._-], got {self.id!r}")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"weight must be a finite number > 0, got {w!r}")
        object.__setattr__(self, "weight", float(w))


def _tier(name: str) -> str:
    tier = normalize_tier(str(name))
    if tier is None:
        raise ValueError(f"unknown tier {name!r} (tiers: {', '.join(TIERS)})")
    return tier


def tenant_from_dict(tenant_id: str, data: dict[str, Any]) -> Tenant:
    known = set(QUOTA_FIELDS) | set(BUDGET_FIELDS) | {"allowed_tiers", "default_tier", "name",
                                                       "weight"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"tenant {tenant_id}: unknown fields {sorted(unknown)}")
    quota = {k: v for k, v in data.items() if k not in ("name", "weight")}
    if "allowed_tiers" in quota:
        quota["allowed_tiers"] = tuple(quota["allowed_tiers"])
    return Tenant(tenant_id, str(data.get("name", tenant_id)), TenantQuota(**quota),
                  data.get("weight", 1.0))


def read_tenants_doc(path: str | Path) -> dict[str, Any]:
    """A tenants file as a document: TOML, or YAML of the same shape (``.yaml``/``.yml``)."""
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(path.read_text()) or {}
    return tomllib.loads(path.read_text())


def load_tenants_file(path: str | Path) -> list[Tenant]:
    """Read ``[tenants.<id>]`` tables from a TOML file (``.yaml``/``.yml``: the same shape)."""
    doc = read_tenants_doc(path)
    tenants = doc.get("tenants", {})
    if not isinstance(tenants, dict):
        raise ValueError(f"{path}: 'tenants' must be a table of tenant ids")  # noqa: TRY004
    return [tenant_from_dict(str(tid), dict(body)) for tid, body in tenants.items()]


def _to_hash(t: Tenant) -> dict[str, str]:
    q = t.quota
    out = {name: str(getattr(q, name)) for name in QUOTA_FIELDS}
    out.update(name=t.name, allowed_tiers=",".join(q.allowed_tiers), default_tier=q.default_tier,
               weight=repr(t.weight), budget_tokens=str(q.budget_tokens),
               budget_cost=repr(float(q.budget_cost)), budget_period=q.budget_period)
    return out


def _from_hash(tenant_id: str, h: dict[bytes, bytes]) -> Tenant:
    d = {k.decode(): v.decode() for k, v in h.items()}
    quota = TenantQuota(
        **{name: int(d.get(name, "0")) for name in QUOTA_FIELDS},
        allowed_tiers=tuple(t for t in d.get("allowed_tiers", "").split(",") if t) or TIERS,
        default_tier=d.get("default_tier", INTERACTIVE),
        budget_tokens=int(d.get("budget_tokens", "0")),
        budget_cost=float(d.get("budget_cost", "0")),
        budget_period=d.get("budget_period", "monthly"),
    )
    return Tenant(tenant_id, d.get("name", tenant_id), quota, float(d.get("weight", "1")))


class TenantStore:
    """Tenants and keys in Redis (redis-py asyncio client, bytes responses)."""

    def __init__(self, redis: Any, keys: RedisKeys, secret: bytes) -> None:
        self.redis = redis
        self.keys = keys
        self._secret = secret

    async def put(self, tenant: Tenant) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.tenant(tenant.id))
        pipe.hset(self.keys.tenant(tenant.id), mapping=_to_hash(tenant))
        pipe.sadd(self.keys.tenants, tenant.id)
        await pipe.execute()

    async def get(self, tenant_id: str) -> Tenant | None:
        h = await self.redis.hgetall(self.keys.tenant(tenant_id))
        return _from_hash(tenant_id, h) if h else None

    async def list(self) -> builtins.list[Tenant]:
        ids = sorted(m.decode() for m in await self.redis.smembers(self.keys.tenants))
        found = [await self.get(tid) for tid in ids]
        return [t for t in found if t is not None]

    async def set_quota(self, tenant_id: str, **changes: Any) -> Tenant:
        tenant = await self.get(tenant_id)
        if tenant is None:
            raise KeyError(tenant_id)
        weight = changes.pop("weight", tenant.weight)
        updated = Tenant(tenant.id, tenant.name, tenant.quota.with_changes(**changes), weight)
        await self.put(updated)
        return updated

    async def delete(self, tenant_id: str) -> builtins.list[str] | None:
        """Delete the tenant and revoke its keys in one transaction; its ledger stays. The
        ids of its admitted, unsettled requests (to cancel), or None if there is none."""
        k = self.keys
        digests = await self.redis.hvals(k.tenant_keys(tenant_id))
        pipe = self.redis.pipeline(transaction=True)
        pipe.exists(k.tenant(tenant_id))
        for d in digests:
            pipe.delete(k.apikey(d.decode()))
        pipe.delete(k.tenant_keys(tenant_id), k.tenant(tenant_id))
        pipe.srem(k.tenants, tenant_id)
        res = await pipe.execute()
        if not res[0]:
            return None
        # after the transaction (its own slot): with the tenant gone nothing more is admitted
        return [r.decode() for r in await self.redis.zrange(k.concurrency(tenant_id), 0, -1)]

    async def issue_key(self, tenant_id: str, name: str = "",
                        expires_at: float | None = None) -> tuple[str, str]:
        """A new key for the tenant: returns (key, key_id). The key is not stored.
        ``expires_at`` (unix s; None = never) must be in the future."""
        check_key_fields(name, expires_at, time.time())
        if await self.get(tenant_id) is None:
            raise KeyError(tenant_id)
        key = generate_key()
        digest = key_digest(self._secret, key)
        record = {"tenant": tenant_id, "digest": digest, "created": str(int(time.time())),
                  "name": name}
        if expires_at is not None:
            record["expires"] = str(int(expires_at))
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.apikey(digest), mapping=record)
        pipe.hset(self.keys.tenant_keys(tenant_id), key_id(digest), digest)
        await pipe.execute()
        return key, key_id(digest)

    async def rotate_key(self, tenant_id: str, kid: str, grace_s: int,
                         expires_at: float | None = None) -> tuple[str, str, int] | None:
        """A new key with the old one's name (and ``expires_at``); the old one stays valid
        ``grace_s`` more seconds (never longer than it already would). Returns (new key, new
        key id, the old key's expiry), or None if the tenant has no such key."""
        if isinstance(grace_s, bool) or not isinstance(grace_s, int) or not (
                0 <= grace_s <= MAX_GRACE_S):
            raise ValueError(f"grace_s must be an integer in [0, {MAX_GRACE_S}], got {grace_s!r}")
        digest = await self.redis.hget(self.keys.tenant_keys(tenant_id), kid)
        if digest is None:
            return None
        old = KeyInfo.from_hash(kid, await self.redis.hgetall(self.keys.apikey(digest.decode())))
        now = time.time()
        if old.expired(now):
            raise ValueError(f"key {kid} has already expired")
        key, new_kid = await self.issue_key(tenant_id, old.name, expires_at)
        until = int(now + grace_s)
        if old.expires_at is not None:
            until = min(until, old.expires_at)
        await self.redis.hset(self.keys.apikey(digest.decode()), "expires", str(until))
        return key, new_kid, until

    async def list_keys(self, tenant_id: str) -> builtins.list[str]:
        return sorted(k.decode() for k in await self.redis.hkeys(self.keys.tenant_keys(tenant_id)))

    async def key_infos(self, tenant_id: str) -> builtins.list[KeyInfo]:
        """Each key's id, name, created, last used and expiry: never a secret."""
        pairs = sorted((k.decode(), v.decode()) for k, v in (
            await self.redis.hgetall(self.keys.tenant_keys(tenant_id))).items())
        pipe = self.redis.pipeline(transaction=False)
        for _, digest in pairs:
            pipe.hgetall(self.keys.apikey(digest))
        return [KeyInfo.from_hash(kid, h) for (kid, _), h in zip(pairs, await pipe.execute())
                if h]

    def as_key_id(self, kid: str) -> str:
        """A key id as given, or the id of a full key (to name it without the secret)."""
        return key_id(key_digest(self._secret, kid)) if looks_like_key(kid) else kid

    async def revoke_key(self, tenant_id: str, kid: str) -> bool:
        """Revoke by key id (or by the full key). True if a key was removed."""
        kid = self.as_key_id(kid)
        digest = await self.redis.hget(self.keys.tenant_keys(tenant_id), kid)
        if digest is None:
            return False
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.apikey(digest.decode()))
        pipe.hdel(self.keys.tenant_keys(tenant_id), kid)
        await pipe.execute()
        return True

    async def resolve_key(self, key: str) -> str | None:
        """Tenant id for a presented key, or None (unknown, revoked, expired or malformed)."""
        found = await self.lookup_key(key)
        return found.tenant if found is not None and not found.expired(time.time()) else None

    async def lookup_key(self, key: str) -> KeyLookup | None:
        """The key's tenant and expiry, or None (unknown, revoked or malformed). Marks it
        used when its last use on record is a minute old or more (not on every request:
        callers cache the answer, ``http/auth.py``)."""
        if not looks_like_key(key):
            return None
        digest = key_digest(self._secret, key)
        rec = await self.redis.hmget(self.keys.apikey(digest),
                                     ["tenant", "digest", "expires", "last_used"])
        if rec[0] is None or rec[1] is None or not digests_match(rec[1], digest):
            return None
        now = int(time.time())
        if rec[3] is None or now - int(rec[3]) >= LAST_USED_EVERY_S:
            await self.redis.hset(self.keys.apikey(digest), "last_used", str(now))
        return KeyLookup(rec[0].decode(), int(rec[2]) if rec[2] is not None else None)

    async def add_admin_key(self, key: str, read_only: bool = False) -> str:
        """Register an admin key (a read-only one may only read ``/admin``); its key id."""
        digest = key_digest(self._secret, key)
        await self.redis.sadd(self.keys.admin_keys_read_only if read_only
                              else self.keys.admin_keys, digest)
        return key_id(digest)

    async def has_admin_key(self) -> bool:
        return bool(await self.redis.scard(self.keys.admin_keys))

    async def is_admin_key(self, key: str) -> bool:
        return await self.admin_role(key) == "admin"

    async def admin_role(self, key: str) -> str | None:
        """"admin", "read" (a read-only admin key) or None."""
        if not looks_like_key(key):
            return None
        digest = key_digest(self._secret, key)
        pipe = self.redis.pipeline(transaction=False)
        pipe.sismember(self.keys.admin_keys, digest)
        pipe.sismember(self.keys.admin_keys_read_only, digest)
        full, read = await pipe.execute()
        return "admin" if full else "read" if read else None
