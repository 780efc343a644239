"""What ``carpool tenants`` prints: keys, usage, tiers and the workers' laws as text, and the
reads behind them. Pure formatting apart from the reads; imports no torch."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from policies.tiers import DERIVED_TPOT_HEADROOM

QUOTA_FLAGS = ("rpm", "tpm", "max_concurrency", "max_prompt_tokens", "max_max_tokens")


def when(value: str | None) -> float | None:
    from gateway.tenancy.ledger import parse_time

    return parse_time(value, "expires").timestamp() if value else None


def iso(unix: int | None) -> str:
    import time

    return "-" if unix is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def format_keys(infos: list[Any]) -> str:
    """A line per key: id first, then name, created, last used, expiry; never a secret."""
    rows = [[i.key_id, i.name or "-", iso(i.created), iso(i.last_used), iso(i.expires_at)]
            for i in infos]
    head = ["key_id", "name", "created", "last_used", "expires"]
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                   + "\n" for r in rows)


async def print_usage(redis: Any, keys: Any, store: Any, args: argparse.Namespace) -> int:
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


async def statuses(redis: Any, config: Any) -> list[dict[str, Any]]:
    from gateway.bus.keys import RedisKeys
    from gateway.http.shedding import read_statuses

    return await read_statuses(redis, RedisKeys(config.namespace))


def tier_rows(config: Any, statuses: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
        tpot = secs(r["tpot_p99_s"]) + (
            f" (derived, {r.get('tpot_budget_x') or DERIVED_TPOT_HEADROOM:g}x a lone step)"
            if r["tpot_source"] == "derived" else "")
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
