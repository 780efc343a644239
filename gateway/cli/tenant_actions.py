"""What each ``carpool tenants <action>`` does, one small function an action, against Redis.

``Admin`` holds what every action needs (the store, the audit log, the output); ``ACTIONS``
maps the parser's action names to their functions. Every change an action makes is appended
to the audit trail as the CLI's actor, from this host. Each returns the process's exit code;
a ``KeyError`` (no such tenant) and a ``ValueError`` (bad input) are turned into a line and
an exit code by the caller (``gateway.cli.tenants._run``).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

from gateway.bus.client import redis_client
from gateway.bus.keys import RedisKeys
from gateway.cli.tenant_views import (
    QUOTA_FLAGS,
    format_keys,
    format_laws,
    format_tiers,
    iso,
    print_usage,
    statuses,
    tier_rows,
    when,
)
from gateway.config import GatewayConfig
from gateway.http.admin import tenant_json
from gateway.tenancy.audit import CLI_ACTOR, AuditEntry, AuditLog, changed_only, tenant_action
from gateway.tenancy.keys import generate_key, resolve_secret
from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore


@dataclass
class Admin:
    config: GatewayConfig
    redis: Any
    keys: RedisKeys
    store: TenantStore
    log: AuditLog
    out: TextIO

    @classmethod
    def connect(cls, namespace: str | None, redis_url: str) -> Admin:
        config = GatewayConfig.from_env(namespace=namespace)
        redis = redis_client(redis_url)
        keys = RedisKeys(config.namespace)
        store = TenantStore(redis, keys, resolve_secret(config.secret, config.state_dir))
        return cls(config, redis, keys, store, AuditLog(redis, keys, config.audit_max_entries),
                   sys.stdout)

    async def note(self, action: str | None, target: str, before: Any, after: Any) -> None:
        """Append one change to the audit trail (only the fields that changed)."""
        b, a = changed_only(before, after)
        await self.log.append(AuditEntry(action or tenant_action(before, after), target,
                                         CLI_ACTOR, socket.gethostname(), b, a))

    async def issued(self, tenant_id: str, key: str, kid: str, **extra: Any) -> None:
        await self.note("key.issue", f"{tenant_id}/{kid}", None, {"key_id": kid, **extra})
        self.out.write(f"key (shown once): {key}\nkey id: {kid}\n")


def quota_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes = {f: getattr(args, f) for f in QUOTA_FLAGS if getattr(args, f, None) is not None}
    if getattr(args, "allowed_tiers", None):
        changes["allowed_tiers"] = tuple(t for t in args.allowed_tiers.split(",") if t)
    if getattr(args, "default_tier", None):
        changes["default_tier"] = args.default_tier
    for name in ("budget_tokens", "budget_cost", "budget_period"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    return changes


Action = Callable[[Admin, argparse.Namespace], Awaitable[int]]


async def list_tenants(a: Admin, args: argparse.Namespace) -> int:
    for t in await a.store.list():
        a.out.write(json.dumps(tenant_json(t)) + "\n")
    for row in tier_rows(a.config, await statuses(a.redis, a.config)):
        a.out.write(json.dumps({k: v for k, v in row.items() if k != "status"}) + "\n")
    return 0


async def tiers(a: Admin, args: argparse.Namespace) -> int:
    live = await statuses(a.redis, a.config)
    a.out.write(format_tiers(tier_rows(a.config, live)))
    a.out.write(format_laws(live))
    return 0


async def create(a: Admin, args: argparse.Namespace) -> int:
    tenant = Tenant(args.tenant_id, args.name or args.tenant_id,
                    TenantQuota(**quota_changes(args)))
    before = await a.store.get(tenant.id)
    await a.store.put(tenant)
    await a.note(None, tenant.id, before and tenant_json(before), tenant_json(tenant))
    a.out.write(json.dumps(tenant_json(tenant)) + "\n")
    if not args.no_key:
        key, kid = await a.store.issue_key(args.tenant_id)
        await a.issued(tenant.id, key, kid)
    return 0


async def set_quota(a: Admin, args: argparse.Namespace) -> int:
    before = await a.store.get(args.tenant_id)
    after = await a.store.set_quota(args.tenant_id, **quota_changes(args))
    await a.note(None, after.id, before and tenant_json(before), tenant_json(after))
    a.out.write(json.dumps(tenant_json(after)) + "\n")
    return 0


async def issue_key(a: Admin, args: argparse.Namespace) -> int:
    expires = when(args.expires)
    key, kid = await a.store.issue_key(args.tenant_id, args.name, expires)
    await a.issued(args.tenant_id, key, kid, name=args.name, expires_at=expires)
    return 0


async def rotate_key(a: Admin, args: argparse.Namespace) -> int:
    got = await a.store.rotate_key(args.tenant_id, args.key_id, args.grace, when(args.expires))
    if got is None:
        a.out.write("no such key\n")
        return 1
    key, new_kid, old_until = got
    await a.note("key.rotate", f"{args.tenant_id}/{args.key_id}", {"key_id": args.key_id},
                 {"key_id": args.key_id, "expires_at": old_until, "new_key_id": new_kid})
    a.out.write(f"key (shown once): {key}\nkey id: {new_kid}\n"
                f"old key {args.key_id} valid until {iso(old_until)}\n")
    return 0


async def keys(a: Admin, args: argparse.Namespace) -> int:
    a.out.write(format_keys(await a.store.key_infos(args.tenant_id)))
    return 0


async def revoke_key(a: Admin, args: argparse.Namespace) -> int:
    if not await a.store.revoke_key(args.tenant_id, args.key_id):
        a.out.write("no such key\n")
        return 1
    kid = a.store.as_key_id(args.key_id)
    await a.note("key.revoke", f"{args.tenant_id}/{kid}", {"key_id": kid}, None)
    a.out.write("revoked\n")
    return 0


async def delete(a: Admin, args: argparse.Namespace) -> int:
    from gateway.http.cancel import Canceller

    before = await a.store.get(args.tenant_id)
    inflight = await a.store.delete(args.tenant_id)
    if inflight is None or before is None:
        raise KeyError(args.tenant_id)
    await a.note("tenant.delete", args.tenant_id, tenant_json(before), None)
    canceller = Canceller(a.redis, a.keys, a.config.stream_ttl_s)
    for rid in inflight:
        await canceller.cancel(rid, args.tenant_id, reader_gone=False, reason="tenant deleted")
    a.out.write(f"deleted; {len(inflight)} requests cancelled\n")
    return 0


async def admin_key(a: Admin, args: argparse.Namespace) -> int:
    key = generate_key(admin=True)
    kid = await a.store.add_admin_key(key, read_only=args.read_only)
    await a.note("admin_key.create", kid, None, {"key_id": kid, "read_only": args.read_only})
    a.out.write(f"admin key (shown once{', read-only' if args.read_only else ''}): "
                f"{key}\nkey id: {kid}\n")
    return 0


async def audit(a: Admin, args: argparse.Namespace) -> int:
    if not 1 <= args.count <= 1000:
        raise ValueError("--count must be in 1..1000")
    for e in await AuditLog(a.redis, a.keys).read(args.count):
        a.out.write(json.dumps(e.to_json()) + "\n")
    return 0


async def usage(a: Admin, args: argparse.Namespace) -> int:
    return await print_usage(a.redis, a.keys, a.store, args)


ACTIONS: dict[str, Action] = {
    "list": list_tenants, "tiers": tiers, "create": create, "set-quota": set_quota,
    "issue-key": issue_key, "rotate-key": rotate_key, "keys": keys, "revoke-key": revoke_key,
    "delete": delete, "admin-key": admin_key, "audit": audit, "usage": usage,
}
