"""Admin endpoints (admin key required, enforced by ``AuthMiddleware``): tenants, quotas,
keys, counters and the deployment's live stats (``/admin/stats``), tiers (weights, service
objectives and the workers' live tier status), and the operator console's page. Changes
are visible to every gateway within the auth cache TTL (< 1 s)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.bus.client import text
from gateway.http.console import CONSOLE_ROUTES
from gateway.http.errors import APIError, bad_request
from gateway.http.openai.routes import read_json
from gateway.http.services import Services
from gateway.http.shedding import step_budgets, step_costs, tier_table
from gateway.http.usage import USAGE_ADMIN_ROUTES
from gateway.telemetry.stats_snapshot import StatsHistory
from gateway.tenancy.audit import AuditEntry, AuditLog, changed_only, tenant_action
from gateway.tenancy.keys import generate_key
from gateway.tenancy.ledger import parse_time
from gateway.tenancy.tenants import Tenant, tenant_from_dict

ADMIN_BODY_LIMIT = 64 * 1024
CONSOLE_AUDIT_ENTRIES = 20  # the console shows the last ones (with /admin/stats)


def tenant_json(t: Tenant) -> dict[str, Any]:
    quota = dataclasses.asdict(t.quota)
    quota["allowed_tiers"] = list(t.quota.allowed_tiers)
    return {"id": t.id, "name": t.name, **quota, "weight": t.weight}  # an update keeps it


def _svc(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def _tenant_or_404(svc: Services, tenant_id: str) -> Tenant:
    tenant = await svc.store.get(tenant_id)
    if tenant is None:
        raise APIError(404, f"No tenant '{tenant_id}'", code="tenant_not_found")
    return tenant


async def list_tenants(request: Request) -> Response:
    svc = _svc(request)
    return JSONResponse({"data": [tenant_json(t) for t in await svc.store.list()]})


async def create_tenant(request: Request) -> Response:
    svc = _svc(request)
    body = await read_json(request, ADMIN_BODY_LIMIT)
    tenant_id = body.pop("id", None)
    if not isinstance(tenant_id, str):
        raise bad_request("'id' (string) is required", param="id")
    try:
        tenant = tenant_from_dict(tenant_id, body)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc)) from exc
    before = await svc.store.get(tenant.id)
    await svc.store.put(tenant)
    await _audit(request, None, tenant.id, tenant_json(before) if before else None,
                 tenant_json(tenant))
    return JSONResponse(tenant_json(tenant), status_code=201)


async def update_tenant(request: Request) -> Response:
    svc = _svc(request)
    current = await _tenant_or_404(svc, request.path_params["tenant_id"])
    body = await read_json(request, ADMIN_BODY_LIMIT)
    merged = {**tenant_json(current), **body}
    merged.pop("id", None)
    try:
        tenant = tenant_from_dict(current.id, merged)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc)) from exc
    await svc.store.put(tenant)
    await _audit(request, None, tenant.id, tenant_json(current), tenant_json(tenant))
    return JSONResponse(tenant_json(tenant))


async def _optional_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or {} when there is none."""
    if request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in \
            request.headers:
        return {}
    return await read_json(request, ADMIN_BODY_LIMIT)


def _expiry(body: dict[str, Any]) -> float | None:
    """``expires_at`` (an ISO date-time or unix seconds) or ``expires_in_s``, or None."""
    at, within = body.get("expires_at"), body.get("expires_in_s")
    if at is not None and within is not None:
        raise bad_request("give expires_at or expires_in_s, not both", param="expires_at")
    try:
        if within is not None:
            if isinstance(within, bool) or not isinstance(within, int | float) or within <= 0:
                raise ValueError(f"expires_in_s must be a number > 0, got {within!r}")
            return time.time() + within
        if at is not None:
            return parse_time(str(at), "expires_at").timestamp()
    except ValueError as exc:
        raise bad_request(str(exc), param="expires_at") from exc
    return None


async def issue_key(request: Request) -> Response:
    svc = _svc(request)
    tenant = await _tenant_or_404(svc, request.path_params["tenant_id"])
    body = await _optional_json(request)
    name = body.get("name", "")
    try:
        key, kid = await svc.store.issue_key(tenant.id, name, _expiry(body))
    except ValueError as exc:
        raise bad_request(str(exc), param="expires_at" if "expires" in str(exc)
                          else "name") from exc
    info = {i.key_id: i for i in await svc.store.key_infos(tenant.id)}.get(kid)
    await _audit(request, "key.issue", f"{tenant.id}/{kid}", None,
                 info.to_json() if info else {"key_id": kid})
    return JSONResponse({"tenant": tenant.id, "key": key, "key_id": kid,
                         **(info.to_json() if info else {}),
                         "note": "shown once; store it now"}, status_code=201)


async def rotate_key(request: Request) -> Response:
    svc = _svc(request)
    tenant = await _tenant_or_404(svc, request.path_params["tenant_id"])
    body = await _optional_json(request)
    grace = body.get("grace_s", 0)
    try:
        got = await svc.store.rotate_key(tenant.id, request.path_params["key_id"], grace,
                                         _expiry(body))
    except ValueError as exc:
        raise bad_request(str(exc), param="grace_s") from exc
    if got is None:
        raise APIError(404, "No such key for this tenant", code="key_not_found")
    key, kid, old_until = got
    await _audit(request, "key.rotate", f"{tenant.id}/{request.path_params['key_id']}",
                 {"key_id": request.path_params["key_id"]},
                 {"key_id": request.path_params["key_id"], "expires_at": old_until,
                  "new_key_id": kid})
    return JSONResponse({"tenant": tenant.id, "key": key, "key_id": kid,
                         "old_key_id": request.path_params["key_id"],
                         "old_key_expires_at": old_until,
                         "note": "shown once; store it now"}, status_code=201)


async def list_keys(request: Request) -> Response:
    svc = _svc(request)
    tenant = await _tenant_or_404(svc, request.path_params["tenant_id"])
    infos = await svc.store.key_infos(tenant.id)
    return JSONResponse({"tenant": tenant.id, "data": [i.to_json() for i in infos],
                         "key_ids": [i.key_id for i in infos]})


async def delete_tenant(request: Request) -> Response:
    """Revoke the tenant's keys, delete it and cancel its queued and running requests (their
    clients get the cancel's end); its usage ledger stays readable."""
    svc = _svc(request)
    tenant_id = request.path_params["tenant_id"]
    before = await svc.store.get(tenant_id)
    inflight = await svc.store.delete(tenant_id)
    if inflight is None or before is None:
        raise APIError(404, f"No tenant '{tenant_id}'", code="tenant_not_found")
    await _audit(request, "tenant.delete", tenant_id, tenant_json(before), None)
    cancelled = 0
    for rid in inflight:
        found = await svc.canceller.cancel(rid, tenant_id, reader_gone=False,
                                           reason="tenant deleted")
        cancelled += found in ("queued", "running")
    return JSONResponse({"id": tenant_id, "deleted": True, "cancelled_requests": cancelled})


async def create_admin_key(request: Request) -> Response:
    """A new admin key; ``{"read_only": true}``: one that may only read (GET) ``/admin``."""
    svc = _svc(request)
    body = await _optional_json(request)
    read_only = body.get("read_only", False)
    if not isinstance(read_only, bool):
        raise bad_request("read_only must be true or false", param="read_only")
    key = generate_key(admin=True)
    kid = await svc.store.add_admin_key(key, read_only=read_only)
    await _audit(request, "admin_key.create", kid, None, {"key_id": kid, "read_only": read_only})
    return JSONResponse({"key": key, "key_id": kid, "read_only": read_only,
                         "note": "shown once; store it now"}, status_code=201)


async def revoke_key(request: Request) -> Response:
    svc = _svc(request)
    tenant = await _tenant_or_404(svc, request.path_params["tenant_id"])
    if not await svc.store.revoke_key(tenant.id, request.path_params["key_id"]):
        raise APIError(404, "No such key for this tenant", code="key_not_found")
    kid = svc.store.as_key_id(request.path_params["key_id"])
    await _audit(request, "key.revoke", f"{tenant.id}/{kid}", {"key_id": kid}, None)
    return JSONResponse({"tenant": tenant.id, "key_id": kid,
                         "revoked": True})


async def _audit(request: Request, action: str | None, target: str,
                 before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    """Append the action (None: a tenant write, named by what changed) to the audit trail,
    with the admin key id and the client's address."""
    svc = _svc(request)
    b, a = changed_only(before, after)
    await AuditLog(svc.redis, svc.keys, svc.config.audit_max_entries).append(AuditEntry(
        action or tenant_action(before, after), target,
        getattr(request.state, "admin_key_id", ""),
        request.client.host if request.client else "", b, a))


async def audit(request: Request) -> Response:
    """The newest audit entries first: ``count`` (1-1000, default 50), ``before`` (an entry
    id, to page back)."""
    svc = _svc(request)
    raw, before = request.query_params.get("count", "50"), request.query_params.get("before")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise bad_request(f"count must be an integer in 1..1000, got {raw!r}", param="count")
    if before is not None and not all(p.isdigit() for p in before.split("-", 1)):
        raise bad_request(f"before must be an audit entry id, got {before!r}", param="before")
    entries = await AuditLog(svc.redis, svc.keys).read(int(raw), before or "+")
    return JSONResponse({"object": "list", "data": [e.to_json() for e in entries]})


async def stats(request: Request) -> Response:
    """The queues' counters (admitted, rejected:<limit>, completed...) at the top level, and
    beside them the deployment's live stats and the doctor's findings
    (``gateway/telemetry/stats_snapshot.py``; what ``/console`` and ``carpool doctor`` read),
    and each live worker's step budget (``step_budget``, as ``/admin/tiers`` has it)."""
    svc = _svc(request)
    counters: dict[str, int] = {}
    for raw in await asyncio.gather(*(svc.redis.hgetall(svc.keys.stats(s))
                                      for s in svc.keys.shard_range())):
        for k, v in raw.items():  # each shard counts its own tenants' requests
            counters[text(k)] = counters.get(text(k), 0) + int(v)
    history = getattr(svc.events, "stats_history", None)
    if history is None:  # events that keep no metrics (tests): a history read once, here
        history = StatsHistory(svc.redis, svc.keys, tuple(svc.config.tier_weights))
    budgets = step_budgets(await svc.shedder.statuses())  # each worker's, as it decided last
    recent = await AuditLog(svc.redis, svc.keys).read(CONSOLE_AUDIT_ENTRIES)
    return JSONResponse({**counters, **await history.snapshot(), "step_budget": budgets,
                         "audit": [e.to_json() for e in recent]})


async def tiers(request: Request) -> Response:
    svc = _svc(request)
    statuses = await svc.shedder.statuses()
    return JSONResponse({"object": "list", "data": tier_table(svc.config, statuses),
                         "workers": [s.get("worker") for s in statuses],
                         "step_cost": step_costs(statuses),
                         "step_budget": step_budgets(statuses)})


ADMIN_ROUTES = [
    Route("/admin/tenants", list_tenants, methods=["GET"]),
    Route("/admin/tenants", create_tenant, methods=["POST"]),
    Route("/admin/tenants/{tenant_id}", update_tenant, methods=["PATCH"]),
    Route("/admin/tenants/{tenant_id}", delete_tenant, methods=["DELETE"]),
    Route("/admin/tenants/{tenant_id}/keys/{key_id}/rotate", rotate_key, methods=["POST"]),
    Route("/admin/keys", create_admin_key, methods=["POST"]),
    Route("/admin/audit", audit, methods=["GET"]),
    Route("/admin/tenants/{tenant_id}/keys", issue_key, methods=["POST"]),
    Route("/admin/tenants/{tenant_id}/keys", list_keys, methods=["GET"]),
    Route("/admin/tenants/{tenant_id}/keys/{key_id}", revoke_key, methods=["DELETE"]),
    Route("/admin/stats", stats, methods=["GET"]),
    Route("/admin/tiers", tiers, methods=["GET"]),
    *USAGE_ADMIN_ROUTES,  # the usage ledger (http/usage.py)
    *CONSOLE_ROUTES,  # the operator console's page, a view of /admin/stats (http/console.py)
]
