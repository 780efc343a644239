"""``carpool tenants ...``: manage tenants, quotas and keys directly in Redis.

``carpool tenants tiers`` prints each tier's weight, objectives (TTFT/TPOT p99 targets, overload
action) and the workers' live status (queue depth, service rate, predicted wait) as a table,
then each worker's step-cost law (what its step budget admits lower tiers by);
``list`` prints the tiers' objectives after the tenants, a JSON line per tier.

Finds Redis through ``--redis-url``, ``REDIS_URL``, or the URL a local ``carpool serve`` left
in its state dir (embedded server). Keys are hashed with the same server secret as the
gateway (``CARPOOL_SECRET`` or ``<state_dir>/secret``). Imports no torch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from typing import Any

QUOTA_FLAGS = ("rpm", "tpm", "max_concurrency", "max_prompt_tokens", "max_max_tokens")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tenants", help="manage tenants, quotas and API keys")
    p.add_argument("--redis-url", default=None)
    p.add_argument("--namespace", default=None)
    tsub = p.add_subparsers(dest="action", required=True)
    tsub.add_parser("list", help="list tenants and quotas, then the tiers' objectives (JSON lines)")
    tsub.add_parser("tiers", help="tier weights, service objectives and live status (a table)")
    for name in ("create", "set-quota"):
        c = tsub.add_parser(name, help=f"{name} a tenant")
        c.add_argument("tenant_id")
        if name == "create":
            c.add_argument("--name", default=None)
            c.add_argument("--no-key", action="store_true", help="do not issue a first key")
        for flag in QUOTA_FLAGS:
            c.add_argument("--" + flag.replace("_", "-"), dest=flag, type=int, default=None)
        c.add_argument("--allowed-tiers", default=None, help="comma list, e.g. interactive,batch")
        c.add_argument("--default-tier", default=None)
        c.add_argument("--budget-tokens", type=int, default=None, help="per period; 0 = none")
        c.add_argument("--budget-cost", type=float, default=None,
                       help="per period, at the model's price; 0 = none")
        c.add_argument("--budget-period", default=None, help="daily | monthly")
    tsub.add_parser("keys", help="a tenant's keys: id, name, created, last used, expiry"
                    ).add_argument("tenant_id")
    i = tsub.add_parser("issue-key")
    i.add_argument("tenant_id")
    i.add_argument("--name", default="")
    i.add_argument("--expires", default=None, help="YYYY-MM-DD or ISO date-time (UTC)")
    o = tsub.add_parser("rotate-key", help="a new key; the old one stays valid --grace seconds")
    o.add_argument("tenant_id")
    o.add_argument("key_id")
    o.add_argument("--grace", type=int, default=0, help="seconds the old key stays valid")
    o.add_argument("--expires", default=None, help="the new key's expiry")
    tsub.add_parser("delete", help="revoke its keys, cancel its requests; its usage stays"
                    ).add_argument("tenant_id")
    a = tsub.add_parser("audit", help="the newest admin actions first (JSON lines)")
    a.add_argument("--count", type=int, default=50)
    tsub.add_parser("admin-key", help="issue an admin key").add_argument(
        "--read-only", action="store_true", help="one that may only read /admin")
    u = tsub.add_parser("usage", help="the usage ledger: a table (or --csv / --json)")
    u.add_argument("tenant_id", nargs="?", default=None, help="one tenant (default: all)")
    u.add_argument("--from", dest="start", default=None, help="YYYY-MM-DD or ISO (UTC)")
    u.add_argument("--to", dest="end", default=None, help="exclusive; default now")
    u.add_argument("--by", default="day", help="hour | day | key | tier | model")
    u.add_argument("--csv", action="store_true")
    u.add_argument("--json", action="store_true")
    r = tsub.add_parser("revoke-key")
    r.add_argument("tenant_id")
    r.add_argument("key_id", help="key id (from 'keys') or the key itself")
    p.set_defaults(func=run)


def _quota_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes = {f: getattr(args, f) for f in QUOTA_FLAGS if getattr(args, f, None) is not None}
    if getattr(args, "allowed_tiers", None):
        changes["allowed_tiers"] = tuple(t for t in args.allowed_tiers.split(",") if t)
    if getattr(args, "default_tier", None):
        changes["default_tier"] = args.default_tier
    for name in ("budget_tokens", "budget_cost", "budget_period"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    return changes


def _redis_url(config: Any, explicit: str | None) -> str:
    from gateway.cli.serve import runtime_url_file

    if explicit or config.redis_url:
        return str(explicit or config.redis_url)
    path = runtime_url_file(config)
    if path.is_file():
        return path.read_text().strip()
    raise SystemExit("no Redis: pass --redis-url, set REDIS_URL, or start 'carpool serve' first")


async def _run(args: argparse.Namespace) -> int:
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.config import GatewayConfig
    from gateway.http.admin import tenant_json
    from gateway.tenancy.audit import (
        CLI_ACTOR,
        AuditEntry,
        AuditLog,
        changed_only,
        tenant_action,
    )
    from gateway.tenancy.keys import resolve_secret
    from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore

    config = GatewayConfig.from_env(namespace=args.namespace)
    redis = redis_client(_redis_url(config, args.redis_url))
    store = TenantStore(redis, RedisKeys(config.namespace),
                        resolve_secret(config.secret, config.state_dir))
    out = sys.stdout
    log = AuditLog(redis, RedisKeys(config.namespace), config.audit_max_entries)

    async def note(action: str | None, target: str, before: Any, after: Any) -> None:
        b, a = changed_only(before, after)
        await log.append(AuditEntry(action or tenant_action(before, after), target, CLI_ACTOR,
                                    socket.gethostname(), b, a))

    try:
        if args.action == "list":
            for t in await store.list():
                out.write(json.dumps(tenant_json(t)) + "\n")
            for row in _tier_rows(config, await _statuses(redis, config)):
                out.write(json.dumps({k: v for k, v in row.items() if k != "status"}) + "\n")
        elif args.action == "tiers":
            statuses = await _statuses(redis, config)
            out.write(format_tiers(_tier_rows(config, statuses)))
            out.write(format_laws(statuses))
        elif args.action == "create":
            tenant = Tenant(args.tenant_id, args.name or args.tenant_id,
                            TenantQuota(**_quota_changes(args)))
            before = await store.get(tenant.id)
            await store.put(tenant)
            await note(None, tenant.id, before and tenant_json(before), tenant_json(tenant))
            out.write(json.dumps(tenant_json(tenant)) + "\n")
            if not args.no_key:
                key, kid = await store.issue_key(args.tenant_id)
                await note("key.issue", f"{tenant.id}/{kid}", None, {"key_id": kid})
                out.write(f"key (shown once): {key}\nkey id: {kid}\n")
        elif args.action == "set-quota":
            before = await store.get(args.tenant_id)
            after = await store.set_quota(args.tenant_id, **_quota_changes(args))
            await note(None, after.id, before and tenant_json(before), tenant_json(after))
            out.write(json.dumps(tenant_json(after)) + "\n")
        elif args.action == "issue-key":
            key, kid = await store.issue_key(args.tenant_id, args.name, _when(args.expires))
            await note("key.issue", f"{args.tenant_id}/{kid}", None,
                       {"key_id": kid, "name": args.name, "expires_at": _when(args.expires)})
            out.write(f"key (shown once): {key}\nkey id: {kid}\n")
        elif args.action == "rotate-key":
            got = await store.rotate_key(args.tenant_id, args.key_id, args.grace,
                                         _when(args.expires))
            if got is None:
                out.write("no such key\n")
                return 1
            await note("key.rotate", f"{args.tenant_id}/{args.key_id}", {"key_id": args.key_id},
                       {"key_id": args.key_id, "expires_at": got[2], "new_key_id": got[1]})
            out.write(f"key (shown once): {got[0]}\nkey id: {got[1]}\n"
                      f"old key {args.key_id} valid until {_iso(got[2])}\n")
        elif args.action == "keys":
            out.write(format_keys(await store.key_infos(args.tenant_id)))
        elif args.action == "delete":
            from gateway.http.cancel import Canceller

            before = await store.get(args.tenant_id)
            inflight = await store.delete(args.tenant_id)
            if inflight is None or before is None:
                raise KeyError(args.tenant_id)
            await note("tenant.delete", args.tenant_id, tenant_json(before), None)
            canceller = Canceller(redis, RedisKeys(config.namespace), config.stream_ttl_s)
            for rid in inflight:
                await canceller.cancel(rid, reader_gone=False, reason="tenant deleted")
            out.write(f"deleted; {len(inflight)} requests cancelled\n")
        elif args.action == "admin-key":
            from gateway.tenancy.keys import generate_key

            key = generate_key(admin=True)
            kid = await store.add_admin_key(key, read_only=args.read_only)
            await note("admin_key.create", kid, None, {"key_id": kid,
                                                        "read_only": args.read_only})
            out.write(f"admin key (shown once{', read-only' if args.read_only else ''}): "
                      f"{key}\nkey id: {kid}\n")
        elif args.action == "audit":
            from gateway.tenancy.audit import AuditLog

            if not 1 <= args.count <= 1000:
                raise ValueError("--count must be in 1..1000")
            for e in await AuditLog(redis, RedisKeys(config.namespace)).read(args.count):
                out.write(json.dumps(e.to_json()) + "\n")
        elif args.action == "usage":
            return await _usage(redis, RedisKeys(config.namespace), store, args)
        elif args.action == "revoke-key":
            if not await store.revoke_key(args.tenant_id, args.key_id):
                out.write("no such key\n")
                return 1
            kid = store.as_key_id(args.key_id)
            await note("key.revoke", f"{args.tenant_id}/{kid}", {"key_id": kid}, None)
            out.write("revoked\n")
    except KeyError as exc:
        out.write(f"no tenant {exc}\n")
        return 1
    except ValueError as exc:
        out.write(f"error: {exc}\n")
        return 2
    finally:
        await redis.aclose()
    return 0


def _when(value: str | None) -> float | None:
    from gateway.tenancy.ledger import parse_time

    return parse_time(value, "expires").timestamp() if value else None


def _iso(unix: int | None) -> str:
    import time

    return "-" if unix is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def format_keys(infos: list[Any]) -> str:
    """A line per key: id first, then name, created, last used, expiry; never a secret."""
    rows = [[i.key_id, i.name or "-", _iso(i.created), _iso(i.last_used), _iso(i.expires_at)]
            for i in infos]
    head = ["key_id", "name", "created", "last_used", "expires"]
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                   + "\n" for r in rows)


async def _usage(redis: Any, keys: Any, store: Any, args: argparse.Namespace) -> int:
    import time

    from gateway.tenancy.ledger import UsageLedger, group_rows, parse_range, to_csv

    ledger = UsageLedger(redis, keys)
    known = await ledger.tenants()
    if args.tenant_id and args.tenant_id not in known and await store.get(args.tenant_id) is None:
        sys.stdout.write(f"no tenant '{args.tenant_id}'\n")
        return 1
    t0, t1 = parse_range(args.start, args.end, time.time())
    rows = group_rows(await ledger.read([args.tenant_id] if args.tenant_id else known, t0, t1),
                      args.by)
    if args.csv:
        sys.stdout.write(to_csv(rows))
    elif args.json:
        for r in rows:
            sys.stdout.write(json.dumps(r.to_json()) + "\n")
    else:
        sys.stdout.write(format_usage(rows, args.by))
    return 0


USAGE_COLUMNS = ("requests", "prompt", "cached", "completion", "undelivered", "errors")


def format_usage(rows: list[Any], by: str) -> str:
    """Ledger rows (``ledger.group_rows``) as an aligned table, one line per tenant and group."""
    group = {"hour": "hour", "day": "hour", "key": "key_id", "tier": "tier", "model": "model"}[by]
    cells = [[r.tenant, getattr(r, group), str(r.requests), str(r.prompt_tokens),
              str(r.cached_tokens), str(r.completion_tokens), str(r.undelivered_tokens),
              " ".join(f"{c}={n}" for c, n in sorted(r.errors.items())) or "-"]
             for r in rows]
    head = ["tenant", by, *USAGE_COLUMNS]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [head, *cells]]
    if not cells:
        lines.append("(no usage in this range)")
    return "\n".join(lines) + "\n"


async def _statuses(redis: Any, config: Any) -> list[dict[str, Any]]:
    from gateway.bus.keys import RedisKeys
    from gateway.http.shedding import read_statuses

    return await read_statuses(redis, RedisKeys(config.namespace))


def _tier_rows(config: Any, statuses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from gateway.http.shedding import tier_table

    return tier_table(config, statuses)


def format_laws(statuses: list[dict[str, Any]]) -> str:
    """The live workers' step-cost laws (what their step budgets admit by), a line each, then
    what each budget decided last (cap, target, gain, alone bias), a line each."""
    from gateway.http.shedding import budget_line, law_line, step_budgets, step_costs

    laws = [law_line(w, law) for w, law in step_costs(statuses).items()]
    budgets = [budget_line(w, state) for w, state in step_budgets(statuses).items()]
    return "".join(line + "\n" for line in laws + budgets)


TIER_COLUMNS = ("tier", "weight", "ttft p99", "tpot p99", "action", "depth", "started/s",
                "wait s", "waiting by tenant")


def format_tiers(rows: list[dict[str, Any]]) -> str:
    """``tier_table`` rows as an aligned text table ('-': not set, or no worker publishing)."""
    def secs(value: Any) -> str:
        return "-" if value is None else f"{value:g}s"

    cells = []
    for r in rows:
        st = r["status"]
        tpot = secs(r["tpot_p99_s"]) + (" (derived)" if r["tpot_source"] == "derived" else "")
        live = ["-", "-", "-", "-"] if st is None else [
            str(st["depth"]), f"{st['rate_rps']:.2f}", f"{st['predicted_wait_s']:.1f}",
            " ".join(f"{t}={n}" for t, n in sorted(st["tenants"].items())) or "-"]
        cells.append([r["tier"], str(r["weight"]), secs(r["ttft_p99_s"]), tpot, r["action"],
                      *live])
    widths = [max(len(c[i]) for c in [list(TIER_COLUMNS), *cells])
              for i in range(len(TIER_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [list(TIER_COLUMNS), *cells]]
    if all(r["status"] is None for r in rows):
        lines.append("(no worker is publishing tier status)")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
