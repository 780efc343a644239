"""The usage ledger: what each tenant consumed, per key id, tier, model and UTC hour.

One Redis hash per tenant-hour, ``{ns}:usage:{tenant}:{YYYYMMDDHH}`` (``bus/keys.py``), whose
fields are ``{key id}|{tier code}|{model id}|{metric}`` -> an integer: the tier as one letter
(``TIER_CODES``) and the model as the first 8 hex digits of its name's SHA-1 (``model_id``;
``{ns}:usage_models`` maps them back), so that every field stays within the 64 bytes Redis
keeps in its compact hash encoding (half the memory). The metrics:

    r            finished requests (completed, cancelled, timed out, failed, migrated)
    p            prompt tokens
    c            prompt tokens served from the prefix cache
    d            completion tokens delivered to the client
    x            completion tokens the engine computed (written by the worker at the finish);
                 x - d is the cancelled work nobody received
    $            prompt, cached and delivered completion tokens at the model's price, in
                 micro-units of the price's currency (``policies/budget.py``; no price: none)
    e:{code}     requests that ended with that error code (timeout, cancelled_by_client...)

The gateway writes a request's row in the settle script (``scripts.SETTLE_LUA``), the same
atomic call that returns its quota reservation, so the two cannot disagree. The row's hour is
the request's arrival hour. Each hash expires at least ``retention`` after its last write (its
TTL is set by each new row's first write: ``ledger_ttl``), so memory is bounded by tenants x
hours kept x distinct (key, tier, model) rows.

Reading: ``UsageLedger.read`` returns ``UsageRow``s, ``group_rows`` sums them by hour, day,
key, tier or model, ``parse_range`` checks a from/to pair; all three are what ``GET
/admin/usage``, ``GET /v1/usage`` and ``carpool tenants usage`` use.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.bus.keys import RedisKeys
from policies.tiers import BATCH, BEST_EFFORT, INTERACTIVE

TIER_CODES = {INTERACTIVE: "i", BATCH: "b", BEST_EFFORT: "e"}
_TIER_NAMES = {code: tier for tier, code in TIER_CODES.items()}
GROUP_BY = ("hour", "day", "key", "tier", "model")
HOUR_FORMAT = "%Y%m%d%H"
SEP = "|"
# the longest range one read may span (a read costs one HGETALL per tenant-hour)
MAX_RANGE_DAYS = 400


# A row's first write sets its hash's TTL and later writes leave it (one EXPIRE a row, not one
# a request): retention plus this margin, so that the hash outlives its last write by at least
# the retention (a tenant-hour's writes end within its hour plus a request's length: requests
# under an hour).
TTL_MARGIN_S = 7200


def ledger_ttl(retention_s: int) -> int:
    """The TTL a tenant-hour hash gets at each new row's first write (0: the ledger is off)."""
    return retention_s + TTL_MARGIN_S if retention_s > 0 else 0


def hour_of(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime(HOUR_FORMAT)


def model_id(model: str) -> str:
    return hashlib.sha1(model.encode()).hexdigest()[:8]


def field_prefix(key_id: str, tier: str, model: str) -> str:
    """The ledger fields' common prefix for one (key, tier, model)."""
    return SEP.join((key_id or "-", TIER_CODES.get(tier, tier), model_id(model))) + SEP


@dataclass(frozen=True)
class LedgerEntry:
    """What one finished request adds to its row: written by the settle script."""

    hour: str  # the arrival hour, ``hour_of``
    prefix: str  # ``field_prefix``
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int  # delivered to the client
    error: str = ""  # the error code it ended with; '' = none


@dataclass(frozen=True)
class UsageRow:
    """One (tenant, hour, key, tier, model) row, or a sum of rows (a group)."""

    tenant: str
    hour: str  # YYYYMMDDHH (UTC); a day group has YYYYMMDD, other groups ''
    key_id: str
    tier: str
    model: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    computed_tokens: int = 0
    cost_micro: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def undelivered_tokens(self) -> int:
        """Completion tokens computed but never delivered (cancelled work)."""
        return max(0, self.computed_tokens - self.completion_tokens)

    def plus(self, other: UsageRow) -> UsageRow:
        errors = dict(self.errors)
        for code, n in other.errors.items():
            errors[code] = errors.get(code, 0) + n
        return replace(self, requests=self.requests + other.requests,
                       prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                       cached_tokens=self.cached_tokens + other.cached_tokens,
                       completion_tokens=self.completion_tokens + other.completion_tokens,
                       computed_tokens=self.computed_tokens + other.computed_tokens,
                       cost_micro=self.cost_micro + other.cost_micro,
                       errors=errors)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["undelivered_tokens"] = self.undelivered_tokens
        out["cost"] = self.cost_micro / 1_000_000
        out["errors"] = dict(sorted(self.errors.items()))
        return out


_METRIC_FIELD = {"r": "requests", "p": "prompt_tokens", "c": "cached_tokens",
                 "d": "completion_tokens", "x": "computed_tokens", "$": "cost_micro"}


def rows_from_hash(tenant: str, hour: str, h: dict[Any, Any],
                   models: dict[str, str] | None = None) -> list[UsageRow]:
    """The rows of one tenant-hour hash (as HGETALL returns it, bytes or str); ``models``
    names the model ids (an unknown one stays an id)."""
    acc: dict[tuple[str, str, str], dict[str, Any]] = {}
    for raw_k, raw_v in h.items():
        k = raw_k.decode() if isinstance(raw_k, bytes) else str(raw_k)
        parts = k.split(SEP)
        if len(parts) != 4:
            continue
        kid, tier, mid, metric = parts
        model = (models or {}).get(mid, mid)
        row = acc.setdefault((kid, _TIER_NAMES.get(tier, tier), model), {"errors": {}})
        if metric.startswith("e:"):
            row["errors"][metric[2:]] = int(raw_v)
        elif metric in _METRIC_FIELD:
            row[_METRIC_FIELD[metric]] = int(raw_v)
    return [UsageRow(tenant, hour, kid, tier, model, **vals)
            for (kid, tier, model), vals in sorted(acc.items())]


def group_rows(rows: Iterable[UsageRow], by: str) -> list[UsageRow]:
    """Sum rows per tenant and ``by`` (hour | day | key | tier | model)."""
    if by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, got {by!r}")
    out: dict[tuple[str, ...], UsageRow] = {}
    for r in rows:
        g = UsageRow(r.tenant, r.hour if by == "hour" else r.hour[:8] if by == "day" else "",
                     r.key_id if by == "key" else "", r.tier if by == "tier" else "",
                     r.model if by == "model" else "")
        k = (g.tenant, g.hour, g.key_id, g.tier, g.model)
        out[k] = out.get(k, g).plus(r)
    return [out[k] for k in sorted(out)]


CSV_COLUMNS = ("tenant", "hour", "key_id", "tier", "model", "requests", "prompt_tokens",
               "cached_tokens", "completion_tokens", "computed_tokens", "undelivered_tokens",
               "cost", "errors")


def to_csv(rows: Iterable[UsageRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        j = r.to_json()
        j["errors"] = ";".join(f"{c}={n}" for c, n in j["errors"].items())
        w.writerow([j[c] for c in CSV_COLUMNS])
    return buf.getvalue()


def parse_time(value: str, name: str) -> datetime:
    """``YYYY-MM-DD``, an ISO date-time (UTC unless it says otherwise) or unix seconds."""
    v = value.strip()
    try:
        if v.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(v), UTC)
        t = datetime.fromisoformat(v)
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"'{name}' is not a date (YYYY-MM-DD, an ISO date-time or unix "
                         f"seconds): {value!r}") from exc
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_range(start: str | None, end: str | None, now: float,
                default_days: int = 30) -> tuple[datetime, datetime]:
    """``[from, to)`` as UTC datetimes: ``to`` defaults to now, ``from`` to ``default_days``
    before ``to``. ValueError for a malformed date, ``from`` after ``to``, or a range past
    ``MAX_RANGE_DAYS``."""
    t1 = parse_time(end, "to") if end else datetime.fromtimestamp(now, UTC)
    t0 = parse_time(start, "from") if start else t1 - timedelta(days=default_days)
    if t0 > t1:
        raise ValueError(f"'from' ({t0.isoformat()}) is after 'to' ({t1.isoformat()})")
    if t1 - t0 > timedelta(days=MAX_RANGE_DAYS):
        raise ValueError(f"the range spans more than {MAX_RANGE_DAYS} days")
    return t0, t1


def hours_between(t0: datetime, t1: datetime) -> list[str]:
    """Every hour that overlaps ``[t0, t1)`` (the hour of ``t0`` included)."""
    h = t0.replace(minute=0, second=0, microsecond=0)
    out = []
    while h < t1 or (h == t0 == t1):
        out.append(h.strftime(HOUR_FORMAT))
        h += timedelta(hours=1)
    return out


class UsageLedger:
    """Reads the ledger (the gateway's settle script and the worker's step write it)."""

    def __init__(self, redis: Any, keys: RedisKeys) -> None:
        self.redis = redis
        self.keys = keys

    async def register_model(self, model: str) -> None:
        """Name ``model``'s id for readers (the gateway does at start)."""
        await self.redis.hset(self.keys.usage_models, model_id(model), model)

    async def tenants(self) -> list[str]:
        k = self.keys
        sets = await asyncio.gather(*(self.redis.smembers(k.usage_tenants(s))
                                      for s in k.shard_range()))
        return sorted({m.decode() if isinstance(m, bytes) else str(m)
                       for raw in sets for m in raw})

    async def read(self, tenants: Iterable[str], t0: datetime, t1: datetime) -> list[UsageRow]:
        hours = hours_between(t0, t1)
        pairs = [(t, h) for t in tenants for h in hours]
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.usage_models)
        for t, h in pairs:
            pipe.hgetall(self.keys.usage(t, h))
        raw_models, *got_all = await pipe.execute()
        models = {_text(k): _text(v) for k, v in raw_models.items()}
        rows: list[UsageRow] = []
        for (t, h), got in zip(pairs, got_all):
            if got:
                rows += rows_from_hash(t, h, got, models)
        return rows


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
