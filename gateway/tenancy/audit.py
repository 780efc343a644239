"""The audit trail: every admin action appended to a bounded Redis stream (``{ns}:audit``).

An entry says when, which admin key (its id: never the key), from which address, the action
(``tenant.create``, ``tenant.update``, ``budget.update``, ``tenant.delete``, ``key.issue``,
``key.rotate``, ``key.revoke``, ``admin_key.create``), its target, and what changed, before
and after. Before/after hold tenant fields and key records (id, name, expiry), never a key or a
digest: ``AuditEntry`` refuses a value that looks like one. The stream keeps about the last
``max_len`` entries (``state_scripts.AUDIT_LUA``: XADD MAXLEN ~), so memory is bounded. The admin API and ``carpool
tenants`` append; ``GET /admin/audit``, ``carpool tenants audit`` and the console read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.bus.keys import RedisKeys
from gateway.bus.resp import LuaScript
from gateway.bus.state_scripts import AUDIT_LUA
from gateway.tenancy.keys import KEY_PREFIX
from gateway.tenancy.tenants import BUDGET_FIELDS

CLI_ACTOR = "cli"  # the admin key id of a change made with ``carpool tenants``


@dataclass(frozen=True)
class AuditEntry:
    action: str
    target: str  # a tenant id (and key id: "acme/3f2a...")
    admin_key_id: str
    address: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    ts: float = field(default_factory=time.time)
    id: str = ""  # the stream entry id, once read

    def __post_init__(self) -> None:
        text = orjson.dumps([self.before, self.after]).decode()
        if KEY_PREFIX in text:
            raise ValueError("an audit entry must not contain a key")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "ts": self.ts, "action": self.action, "target": self.target,
                "admin_key_id": self.admin_key_id, "address": self.address,
                "before": self.before, "after": self.after}


def tenant_action(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """What a tenant write was: create, delete, a budget change (only budget fields
    changed) or an update."""
    if before is None:
        return "tenant.create"
    if after is None:
        return "tenant.delete"
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    return "budget.update" if changed and changed <= set(BUDGET_FIELDS) else "tenant.update"


def changed_only(before: dict[str, Any] | None, after: dict[str, Any] | None
                 ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """For an update, only the fields that changed (whole records for a create or delete)."""
    if before is None or after is None:
        return before, after
    keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return {k: before.get(k) for k in keys}, {k: after.get(k) for k in keys}


class AuditLog:
    def __init__(self, redis: Any, keys: RedisKeys, max_len: int = 10_000) -> None:
        self.redis = redis
        self.key = keys.audit
        self.max_len = max_len
        self._append = LuaScript(redis, None, AUDIT_LUA)

    async def append(self, entry: AuditEntry) -> None:
        data = orjson.dumps({k: v for k, v in entry.to_json().items() if k != "id"})
        await self._append(keys=[self.key], args=[self.max_len, data])

    async def read(self, count: int = 50, before: str = "+") -> list[AuditEntry]:
        """The newest ``count`` entries (older than ``before``, an entry id), newest first."""
        end = before if before == "+" else f"({before}"
        rows = await self.redis.xrevrange(self.key, end, "-", count=count)
        out = []
        for eid, fields in rows:
            d = orjson.loads(fields[b"d"] if b"d" in fields else fields["d"])
            out.append(AuditEntry(d["action"], d["target"], d["admin_key_id"], d["address"],
                                  d.get("before"), d.get("after"), d["ts"],
                                  eid.decode() if isinstance(eid, bytes) else str(eid)))
        return out
