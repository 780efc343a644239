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
from typing import Any

from gateway.cli.tenant_views import QUOTA_FLAGS


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


def _redis_url(config: Any, explicit: str | None) -> str:
    from gateway.cli.serve import runtime_url_file

    if explicit or config.redis_url:
        return str(explicit or config.redis_url)
    path = runtime_url_file(config)
    if path.is_file():
        return path.read_text().strip()
    raise SystemExit("no Redis: pass --redis-url, set REDIS_URL, or start 'carpool serve' first")


async def _run(args: argparse.Namespace) -> int:
    from gateway.cli.tenant_actions import ACTIONS, Admin  # lazily: only this command needs Redis

    admin = Admin.connect(args.namespace, _redis_url_for(args))
    try:
        return await ACTIONS[args.action](admin, args)
    except KeyError as exc:
        admin.out.write(f"no tenant {exc}\n")
        return 1
    except ValueError as exc:
        admin.out.write(f"error: {exc}\n")
        return 2
    finally:
        await admin.redis.aclose()


def _redis_url_for(args: argparse.Namespace) -> str:
    from gateway.config import GatewayConfig

    return _redis_url(GatewayConfig.from_env(namespace=args.namespace), args.redis_url)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
