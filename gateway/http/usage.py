"""Reading the usage ledger over HTTP (``tenancy/ledger.py``).

``GET /admin/usage?tenant=&from=&to=&group_by=hour|day|key|tier|model`` (admin key): every
tenant's rows, or one tenant's; ``GET /v1/usage`` (a tenant key): the caller's own rows only,
and a ``tenant`` that is not the caller's is 404, as an unknown one is. JSON by default;
``Accept: text/csv`` gives CSV. Bad input is a 400 (malformed date, ``from`` after ``to``,
unknown ``group_by``), an unknown tenant a 404, and a CSV with no rows a 404: an empty file
would read as "no usage" where the question may have been wrong.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.http.errors import APIError, bad_request
from gateway.http.services import Services
from gateway.tenancy.ledger import GROUP_BY, UsageLedger, UsageRow, group_rows, parse_range, to_csv


def _svc(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


def _tenant_not_found(tenant_id: str) -> APIError:
    return APIError(404, f"No tenant '{tenant_id}'", code="tenant_not_found", param="tenant")


async def _answer(request: Request, tenants: list[str]) -> Response:
    q = request.query_params
    by = q.get("group_by", "hour")
    if by not in GROUP_BY:
        raise bad_request(f"group_by must be one of {', '.join(GROUP_BY)}, got {by!r}",
                          param="group_by")
    try:
        t0, t1 = parse_range(q.get("from"), q.get("to"), time.time())
    except ValueError as exc:
        raise bad_request(str(exc), param="from" if "from" in str(exc) else "to") from exc
    svc = _svc(request)
    rows: list[UsageRow] = group_rows(
        await UsageLedger(svc.redis, svc.keys).read(tenants, t0, t1), by)
    if "text/csv" in request.headers.get("accept", ""):
        if not rows:
            raise APIError(404, "no usage in this range", code="no_usage")
        return Response(to_csv(rows), media_type="text/csv")
    return JSONResponse({"object": "list", "from": t0.isoformat(), "to": t1.isoformat(),
                         "group_by": by, "data": [r.to_json() for r in rows]})


async def admin_usage(request: Request) -> Response:
    svc = _svc(request)
    tenant = request.query_params.get("tenant")
    if tenant:
        known = await svc.store.get(tenant) is not None
        if not known and tenant not in await UsageLedger(svc.redis, svc.keys).tenants():
            raise _tenant_not_found(tenant)  # a deleted tenant's ledger stays readable
        return await _answer(request, [tenant])
    return await _answer(request, await UsageLedger(svc.redis, svc.keys).tenants())


async def own_usage(request: Request) -> Response:
    own = request.state.tenant.id
    asked = request.query_params.get("tenant")
    if asked and asked != own:
        raise _tenant_not_found(asked)  # never another tenant's, nor whether it exists
    return await _answer(request, [own])


USAGE_ADMIN_ROUTES = [Route("/admin/usage", admin_usage, methods=["GET"])]
USAGE_ROUTES = [Route("/v1/usage", own_usage, methods=["GET"])]
