"""The request fields that constrain the output, read into one ``StructuredSpec``, and the
check that it compiles before anything reaches Redis.

Read (at most one of them per request; two is a 400 naming the second):

- OpenAI's ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``;
- vLLM's ``guided_json`` (a schema, object or string), ``guided_regex``, ``guided_choice``
  (a list of strings), ``guided_grammar`` (a Lark grammar: llguidance's syntax), and the
  newer ``structured_outputs`` object with the same keys (``json``, ``regex``, ``choice``,
  ``grammar``, ``json_object``); ``guided_decoding_backend`` may name this backend only.

Every refusal is a 400 with ``param`` set to the field: a malformed value, a source past
``GatewayConfig.max_grammar_bytes``, what the backend refuses (an invalid schema, a keyword
it does not implement: named in the message), or a compile past
``GatewayConfig.grammar_compile_timeout_s`` (remembered: the same spec is refused at once
next time, and never compiled on a worker).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from engine.core.structured import StructuredSpec
from engine.structured.compiler import CompileTooSlow, GrammarCompiler, GrammarError
from gateway.http.errors import bad_request

BACKENDS = ("auto", "guidance", "llguidance")  # what guided_decoding_backend may name
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def parse_structured(body: dict[str, Any], max_bytes: int) -> tuple[StructuredSpec, str] | None:
    """The spec the request asks for and the field it came from; None: unconstrained."""
    found: list[tuple[StructuredSpec, str]] = []
    fmt = body.get("response_format")
    if fmt is not None:
        spec = _response_format(fmt)
        if spec is not None:
            found.append((spec, "response_format"))
    for name, key in _GUIDED.items():
        if body.get(name) is not None:
            found.append((_guided(key, body[name], name), name))
    so = body.get("structured_outputs")
    if so is not None:
        found.extend(_structured_outputs(so))
    backend = body.get("guided_decoding_backend")
    if backend is not None and backend not in BACKENDS:
        raise bad_request(f"'guided_decoding_backend' {backend!r} is not available: this "
                          f"server constrains with llguidance (one of {BACKENDS})",
                          param="guided_decoding_backend", code="unsupported_parameter")
    if len(found) > 1:
        raise bad_request(f"only one output constraint per request: {found[0][1]!r} and "
                          f"{found[1][1]!r} were both given", param=found[1][1])
    if not found:
        return None
    spec, param = found[0]
    if len(spec.source.encode()) > max_bytes:
        raise bad_request(f"the {spec.kind} is {len(spec.source.encode())} bytes; this server's "
                          f"limit is {max_bytes}", param=param, code="grammar_too_large")
    return spec, param


def _response_format(fmt: Any) -> StructuredSpec | None:
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'",
                          param="response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec("json_object")
    if kind != "json_schema":
        raise bad_request(f"'response_format.type' must be 'text', 'json_object' or "
                          f"'json_schema', got {kind!r}", param="response_format")
    js = fmt.get("json_schema")
    if not isinstance(js, dict):
        raise bad_request("'response_format.json_schema' must be an object with 'name' and "
                          "'schema'", param="response_format.json_schema")
    name = js.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_request("'response_format.json_schema.name' must be 1-64 letters, digits, "
                          "'_' or '-'", param="response_format.json_schema.name")
    schema = js.get("schema", {})
    if not isinstance(schema, dict):
        raise bad_request("'response_format.json_schema.schema' must be a JSON Schema object",
                          param="response_format.json_schema.schema")
    if not isinstance(js.get("strict", False), (bool, type(None))):
        raise bad_request("'response_format.json_schema.strict' must be a boolean",
                          param="response_format.json_schema.strict")
    return StructuredSpec("json_schema", _dumps(schema))


def _guided(key: str, value: Any, param: str) -> StructuredSpec:
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise bad_request(f"'{param}' is not valid JSON: {exc}", param=param) from exc
        if not isinstance(value, dict):
            raise bad_request(f"'{param}' must be a JSON Schema object", param=param)
        return StructuredSpec("json_schema", _dumps(value))
    if key == "choice":
        if not (isinstance(value, list) and value
                and all(isinstance(c, str) and c for c in value)):
            raise bad_request(f"'{param}' must be a non-empty list of non-empty strings",
                              param=param)
        return StructuredSpec("choice", _dumps(value))
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{param}' must be a non-empty string", param=param)
    return StructuredSpec("regex" if key == "regex" else "grammar", value)


def _structured_outputs(so: Any) -> list[tuple[StructuredSpec, str]]:
    if not isinstance(so, dict):
        raise bad_request("'structured_outputs' must be an object", param="structured_outputs")
    out = []
    for key, value in so.items():
        param = f"structured_outputs.{key}"
        if value is None or value is False:
            continue
        if key in ("json", "regex", "choice", "grammar"):
            out.append((_guided(key, value, param), param))
        elif key == "json_object" and value is True:
            out.append((StructuredSpec("json_object"), param))
        elif key not in ("disable_fallback", "disable_any_whitespace",
                         "disable_additional_properties", "whitespace_pattern"):
            raise bad_request(f"'{param}' is not supported by this server", param=param,
                              code="unsupported_parameter")
    return out


def _dumps(value: Any) -> str:
    # sorted keys would reorder properties: the schema's order is the output's order
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def check_compiles(spec: StructuredSpec, param: str, compiler: GrammarCompiler,
                         timeout_s: float) -> None:
    """400 naming ``param`` unless ``spec`` compiles within ``timeout_s`` (compiled on the
    compiler's thread; a cached spec answers at once)."""
    future = compiler.submit(spec)
    try:
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)
        except TimeoutError:
            compiler.refuse(spec, f"compiling it took longer than {timeout_s:g} s")
            raise CompileTooSlow() from None
    except CompileTooSlow as exc:
        raise bad_request(f"the {spec.kind} took longer than this server's compile limit of "
                          f"{timeout_s:g} s", param=param, code="grammar_compile_timeout") from exc
    except GrammarError as exc:
        unsupported = "Unimplemented" in str(exc) or "not supported" in str(exc)
        what = "uses what this server's grammar backend does not support" if unsupported \
            else "is not valid"
        raise bad_request(f"the {spec.kind} in '{param}' {what}: {exc}", param=param,
                          code="unsupported_schema_feature" if unsupported
                          else "invalid_schema") from exc
