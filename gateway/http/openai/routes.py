"""OpenAI-compatible endpoints: chat/completions, completions, models, and the request
resource (``GET /v1/requests/{id}``, ``POST /v1/requests/{id}/cancel``, owner only).

A completion goes: body (size-limited) -> JSON -> validate + tokenize -> tier -> tenant limits
-> early shedding (``http/shedding.py``: 429/503 at once when the tier's predicted wait is past
its target) -> admission (quota + enqueue in one Lua call) -> ``RelayResponse`` streams the
output back.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.bus.client import text
from gateway.bus.messages import SubmitMsg
from gateway.http.errors import APIError, bad_request
from gateway.http.openai.fields import check_engine, check_fields
from gateway.http.openai.format import Formatter
from gateway.http.openai.logprobs import token_text
from gateway.http.openai.schema import ParsedRequest, parse_chat, parse_completion
from gateway.http.openai.structured import check_compiles
from gateway.http.relay import RelayContext, RelayResponse
from gateway.http.services import Services
from gateway.tenancy.ledger import field_prefix, hour_of
from gateway.tenancy.tenants import Tenant
from policies.tiers import normalize_tier, tier_priority

TIER_HEADER = "x-carpool-tier"


def _services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``limit`` bytes (checked while reading)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # '[[[[...' nested past the parser's stack
        raise bad_request("request body is nested too deeply") from exc
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if b"\\u" in raw and _has_lone_surrogate(body):
        raise bad_request("request body has a string with a lone UTF-16 surrogate "
                          "(\\ud800-\\udfff escape without its pair)")
    return body


def _has_lone_surrogate(value: Any) -> bool:
    """json.loads accepts '\\ud800' alone; such a str can't be encoded as UTF-8 (tokenizer,
    orjson), so it must be refused here rather than fail later as a 500."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def choose_tier(tenant: Tenant, parsed: ParsedRequest, header: str | None) -> str:
    asked = header or parsed.service_tier
    if asked is None:
        return tenant.quota.default_tier
    tier = normalize_tier(asked)
    if tier is None:
        raise bad_request(f"unknown service tier {asked!r}", param="service_tier")
    if tier not in tenant.quota.allowed_tiers:
        raise APIError(403, f"tier {tier!r} is not allowed for this tenant (allowed: "
                            f"{', '.join(tenant.quota.allowed_tiers)})", code="tier_not_allowed")
    return tier


def resolve_max_tokens(parsed: ParsedRequest, tenant: Tenant, svc: Services) -> int:
    """Check prompt/context/tenant limits (400 with the counts) and pick max_tokens."""
    q, n_prompt, ctx_len = tenant.quota, len(parsed.prompt_token_ids), svc.model.max_model_len
    if q.max_prompt_tokens and n_prompt > q.max_prompt_tokens:
        raise bad_request(f"prompt has {n_prompt} tokens; this tenant's limit is "
                          f"{q.max_prompt_tokens}", code="prompt_too_long")
    if n_prompt >= ctx_len:
        raise bad_request(f"This model's maximum context length is {ctx_len} tokens; the prompt "
                          f"has {n_prompt} tokens", code="context_length_exceeded")
    max_tokens = parsed.max_tokens
    if max_tokens is None:
        max_tokens = min(svc.config.default_max_tokens, ctx_len - n_prompt,
                         q.max_max_tokens or ctx_len)
    if q.max_max_tokens and max_tokens > q.max_max_tokens:
        raise bad_request(f"max_tokens={max_tokens} exceeds this tenant's limit of "
                          f"{q.max_max_tokens}", param="max_tokens")
    if n_prompt + max_tokens > ctx_len:
        raise bad_request(f"This model's maximum context length is {ctx_len} tokens. However, "
                          f"you requested {n_prompt + max_tokens} tokens ({n_prompt} in the "
                          f"prompt, {max_tokens} for the completion)",
                          code="context_length_exceeded", param="max_tokens")
    reserved = reserve(parsed, max_tokens)
    if q.tpm and reserved > q.tpm:
        raise bad_request(f"this request reserves {reserved} tokens; the tenant's "
                          f"tokens-per-minute limit is {q.tpm}", code="tpm_too_small")
    return max_tokens


def reserve(parsed: ParsedRequest, max_tokens: int) -> int:
    """Tokens reserved against the tenant's tpm: the prompt once, ``max_tokens`` per choice
    (n > 1 sequences share the prompt's KV; each one's tokens are charged)."""
    return len(parsed.prompt_token_ids) + parsed.n * max_tokens


async def _completion(request: Request, kind: str) -> Response:
    received = time.time()  # the TTFT budget's first mark (``policies.ttft_split``)
    svc = _services(request)
    tenant: Tenant = request.state.tenant
    body = await read_json(request, svc.config.max_body_bytes)
    check_fields(body, kind, svc.config.strict_api)
    parse = parse_chat if kind == "chat" else parse_completion
    parsed = parse(body, svc.model.tokenizer, svc.model.name, svc.model.vocab_size,
                   svc.config.max_n, svc.config.max_grammar_bytes)
    check_engine(parsed, svc.config.engine)
    if parsed.structured is not None and svc.grammars is not None:
        await check_compiles(parsed.structured, parsed.structured_param or "response_format",
                             svc.grammars, svc.config.grammar_compile_timeout_s)
    tier = choose_tier(tenant, parsed, request.headers.get(TIER_HEADER))
    max_tokens = resolve_max_tokens(parsed, tenant, svc)
    if parsed.min_tokens > max_tokens:
        raise bad_request(f"min_tokens={parsed.min_tokens} is more than max_tokens={max_tokens}",
                          param="min_tokens")
    shed = await svc.shedder.check(tenant.id, tier)
    if shed is not None:
        svc.events.request_rejected(tenant.id, shed.status, shed.code or "shed", tier=tier)
        raise shed
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    rid = f"{prefix}-{secrets.token_hex(16)}"
    now, loop_now = time.time(), asyncio.get_running_loop().time()
    timeout = svc.config.request_timeout_s
    msg = SubmitMsg(
        request_id=rid, tenant_id=tenant.id, tier=tier, priority=tier_priority(tier),
        prompt_token_ids=parsed.prompt_token_ids, max_tokens=max_tokens,
        temperature=parsed.temperature, top_p=parsed.top_p, seed=parsed.seed, stop=parsed.stop,
        arrival_unix=now, deadline_unix=now + timeout, received_unix=received,
        stream=parsed.stream,
        top_k=parsed.top_k, min_p=parsed.min_p, min_tokens=parsed.min_tokens,
        repetition_penalty=parsed.repetition_penalty, presence_penalty=parsed.presence_penalty,
        frequency_penalty=parsed.frequency_penalty, logit_bias=parsed.logit_bias,
        ignore_eos=parsed.ignore_eos, logprobs=parsed.logprobs,
        stop_token_ids=parsed.stop_token_ids, n=parsed.n, ledger_hour=hour_of(now),
        ledger_prefix=field_prefix(getattr(request.state, "key_id", ""), tier, svc.model.name),
        structured_kind=parsed.structured.kind if parsed.structured else "",
        structured_source=parsed.structured.source if parsed.structured else "",
        traceparent=svc.events.request_started(
            rid, tenant.id, tier, svc.model.name, len(parsed.prompt_token_ids), max_tokens,
            parsed.stream, request.headers.get("traceparent")),
    )
    n_prompt = len(parsed.prompt_token_ids)
    admission = await svc.quota.admit(tenant, msg, reserve(parsed, max_tokens),
                                      svc.placement.prefer(svc.shedder.workers,
                                                           parsed.prompt_token_ids))
    if not admission.ok:
        svc.events.request_rejected(tenant.id, 429, admission.reason, request_id=rid)
        raise APIError(429, admission.message, code=admission.reason,
                       retry_after=admission.retry_after_s, headers=admission.headers)
    svc.events.request_admitted(tenant.id, tier, rid, n_prompt, msg.traceparent)
    ctx = RelayContext(
        request_id=rid, tenant=tenant, tier=tier, prompt_tokens=n_prompt,
        ledger_hour=msg.ledger_hour, ledger_prefix=msg.ledger_prefix,
        headers=tuple((k.encode(), v.encode()) for k, v in admission.headers),
        budget_key=admission.budget_key, budget_charge=admission.budget_charge,
        reserved_tokens=reserve(parsed, max_tokens), stream=parsed.stream,
        include_usage=parsed.include_usage,
        formatter=Formatter(kind, rid, svc.model.name, int(now), tier,
                            token_text(svc.model.tokenizer) if parsed.logprobs is not None
                            else None, n=parsed.n, tools=_tool_mode(parsed)),
        started=loop_now, deadline=loop_now + timeout, received_unix=received,
        enqueued_unix=now,
    )
    return RelayResponse(svc, ctx)  # type: ignore[return-value]


def _tool_mode(parsed: ParsedRequest) -> str | None:
    """How the answer's tool calls are parsed: "auto" (text or a call), "call" (a call),
    None (no tools, or tool_choice none)."""
    if parsed.tools is None or not parsed.tools.constrains:
        return None
    return "auto" if parsed.tools.choice == "auto" else "call"


async def chat_completions(request: Request) -> Response:
    return await _completion(request, "chat")


async def completions(request: Request) -> Response:
    return await _completion(request, "completion")


async def list_models(request: Request) -> Response:
    svc = _services(request)
    return JSONResponse({"object": "list", "data": [{
        "id": svc.model.name, "object": "model", "created": 0, "owned_by": "carpool",
        "max_model_len": svc.model.max_model_len}]})


async def _owned(request: Request) -> tuple[Services, str]:
    """The request id if the caller's tenant owns it; 404 otherwise (never reveal others')."""
    svc = _services(request)
    rid = request.path_params["request_id"]
    owner = await svc.canceller.owner(rid, request.state.tenant.id)
    if owner is None or owner != request.state.tenant.id:
        raise APIError(404, f"No request with id '{rid}'", code="request_not_found")
    return svc, rid


async def get_request(request: Request) -> Response:
    svc, rid = await _owned(request)
    fields = await svc.redis.hmget(svc.keys.req(rid, request.state.tenant.id), ["state", "tier"])
    return JSONResponse({"id": rid, "object": "request",
                         "status": text(fields[0] or b"finished"),
                         "service_tier": text(fields[1] or b"")})


async def cancel_request(request: Request) -> Response:
    svc, rid = await _owned(request)
    found = await svc.canceller.cancel(rid, request.state.tenant.id, reader_gone=False,
                                       reason="explicit")
    svc.events.request_cancelled(rid, "explicit")
    cancelled = found in ("queued", "running")
    return JSONResponse({"id": rid, "object": "request.cancel",
                         "status": "cancelled" if cancelled else "already_finished"})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    svc: Services | None = getattr(request.app.state, "services", None)
    checks = {"model": svc is not None and svc.model is not None, "redis": False}
    if svc is not None and svc.engine is not None:
        checks["engine"] = bool(getattr(svc.engine, "healthy", True))
    if svc is not None:
        try:
            checks["redis"] = bool(await svc.redis.ping())
        except Exception:  # noqa: BLE001  (not ready, whatever the reason)
            checks["redis"] = False
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "not_ready", **checks},
                        status_code=200 if ok else 503)
