"""The OpenAI-compatible API over real HTTP (uvicorn), real Redis and the real engine on the
tiny random Llama: happy paths, sampling options, and every bad input -> 4xx, never a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.gateway.harness import make_tenant

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def key(tiny_gateway: Any, redis_url: str) -> str:
    return make_tenant(redis_url, tiny_gateway.config.namespace, "acme", max_prompt_tokens=200,
                       max_max_tokens=64, allowed_tiers=("interactive", "batch"))


@pytest.fixture(scope="module")
def client(tiny_gateway: Any, key: str) -> Any:
    with httpx.Client(base_url=tiny_gateway.url, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def model(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


def sse_events(text: str) -> list[Any]:
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_health_without_a_key(tiny_gateway: Any) -> None:
    # what guidellm and other vLLM-aware clients call first, with no key or with one
    r = httpx.get(tiny_gateway.url + "/health")
    assert r.status_code == 200, r.text
    r = httpx.get(tiny_gateway.url + "/health", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer cp-not-a-real-key-123456"}])
@pytest.mark.parametrize("path", ["/v1/nope", "/nope", "/v1/chat/completion"])
def test_unknown_path_is_404_with_or_without_key(tiny_gateway: Any, path: str,
                                                 headers: dict[str, str]) -> None:
    r = httpx.post(tiny_gateway.url + path, json={}, headers=headers)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["type"] == "not_found_error" and path in err["message"]
    assert httpx.get(tiny_gateway.url + path, headers=headers).status_code == 404


def test_health_ready_models(client: httpx.Client, model: str, tiny_gateway: Any) -> None:
    assert httpx.get(tiny_gateway.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(tiny_gateway.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["redis"] and ready.json()["model"]
    assert model == tiny_gateway.engine.model_name


def test_chat_non_streaming_usage(client: httpx.Client, model: str) -> None:
    r = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    tok = client_tokenizer(model)
    expected_prompt = len(tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False))
    usage = body["usage"]
    assert usage["prompt_tokens"] == expected_prompt
    assert 1 <= usage["completion_tokens"] <= 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 7


_TOKENIZERS: dict[str, Any] = {}


def client_tokenizer(model: str) -> Any:
    """An independent tokenizer instance (the test's own, not the gateway's)."""
    if "tok" not in _TOKENIZERS:
        from transformers import AutoTokenizer

        from tests.model_factories import smollm2_dir

        _TOKENIZERS["tok"] = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    return _TOKENIZERS["tok"]


def test_stream_matches_non_stream_and_reports_usage(client: httpx.Client, model: str) -> None:
    req = {"model": model, "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
    full = client.post("/v1/completions", json=req).json()
    r = client.post("/v1/completions", json={**req, "stream": True,
                                             "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == full["usage"]
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert text == full["choices"][0]["text"]
    assert events[-3]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert r.headers["x-request-id"] == events[0]["id"]


def test_chat_stream_shape(client: httpx.Client, model: str) -> None:
    r = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
        "stream": True})
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == "[DONE]" and "usage" not in events[-2]
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_seed_reproducible_and_stop(client: httpx.Client, model: str) -> None:
    req = {"model": model, "prompt": "Once upon", "max_tokens": 16, "temperature": 1.0,
           "seed": 1234}
    a = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    b = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    assert a == b and a
    greedy = client.post("/v1/completions", json={**req, "temperature": 0}).json()
    text = greedy["choices"][0]["text"]
    stop = text[len(text) // 2:][:3]
    assert stop.strip(), text
    stopped = client.post("/v1/completions", json={**req, "temperature": 0, "stop": [stop]}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"] == text[: text.index(stop)]


def test_top_p_tiny_is_greedy(client: httpx.Client, model: str) -> None:
    req = {"model": model, "prompt": "Hello world", "max_tokens": 8}
    greedy = client.post("/v1/completions", json={**req, "temperature": 0}).json()
    nucleus = client.post("/v1/completions", json={**req, "temperature": 1.0, "top_p": 1e-6,
                                                    "seed": 3}).json()
    assert nucleus["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_tier_header_and_body(client: httpx.Client, model: str) -> None:
    req = {"model": model, "prompt": "x", "max_tokens": 2}
    assert client.post("/v1/completions", json=req).json()["service_tier"] == "interactive"
    assert client.post("/v1/completions", json={**req, "service_tier": "batch"}
                       ).json()["service_tier"] == "batch"
    assert client.post("/v1/completions", json=req, headers={"X-Carpool-Tier": "batch"}
                       ).json()["service_tier"] == "batch"


BAD_BODIES = [
    ({"model": None, "prompt": "x"}, 400, "model"),
    ({"model": 5, "prompt": "x"}, 400, "model"),
    ({"prompt": 7}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": [1, "a"]}, 400, "prompt"),
    ({"prompt": [10 ** 9]}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "temperature": 3}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "seed": 1.5}, 400, "seed"),
    ({"prompt": "x", "stop": [1]}, 400, "stop"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "x", "n": 9}, 400, "n"),  # over the default cap of 8
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "n": 2, "best_of": 3}, 400, "best_of"),
    ({"prompt": "x", "max_tokens": 65}, 400, "max_tokens"),  # tenant max_max_tokens 64
    ({"prompt": "x", "service_tier": "gold"}, 400, "service_tier"),
    ({"prompt": "x", "temperature": 10 ** 400}, 400, "temperature"),  # float() overflows
    ({"prompt": "x", "top_p": -(10 ** 400)}, 400, "top_p"),
    ({"prompt": "x", "seed": 2 ** 70}, 400, "seed"),
    ({"prompt": "x", "stop": ["z" * 257]}, 400, "stop"),
]


@pytest.mark.parametrize("body,status,param", BAD_BODIES)
def test_bad_completion_bodies(client: httpx.Client, model: str, body: dict[str, Any],
                               status: int, param: str) -> None:
    r = client.post("/v1/completions", json={"model": model, **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


@pytest.mark.parametrize("body,param", [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 30}, "n"),
])
def test_bad_chat_bodies(client: httpx.Client, model: str, body: dict[str, Any], param: str) -> None:
    r = client.post("/v1/chat/completions", json={"model": model, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_and_non_object(client: httpx.Client) -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe", b"", b"[" * 100_000):
        r = client.post("/v1/completions", content=raw,
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("where", ["stop", "prompt", "chat"])
def test_lone_surrogate_in_a_string_is_400_not_500(client: httpx.Client, model: str,
                                                   where: str) -> None:
    fields = {
        "stop": '"prompt": "hi", "stop": ["\\ud800"]',
        "prompt": '"prompt": "a\\udc00b"',
        "chat": '"messages": [{"role": "user", "content": "\\ud83d"}]',
    }[where]
    path = "/v1/chat/completions" if where == "chat" else "/v1/completions"
    raw = f'{{"model": "{model}", "max_tokens": 2, {fields}}}'.encode()
    r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["error"]["message"]
    # a proper pair (an emoji) is fine
    ok = f'{{"model": "{model}", "max_tokens": 2, "prompt": "\\ud83d\\ude00"}}'.encode()
    r = client.post("/v1/completions", content=ok, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_body_too_large_is_413(client: httpx.Client, model: str) -> None:
    big = json.dumps({"model": model, "prompt": "a" * (2 << 20)})
    r = client.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    def chunks() -> Any:  # no Content-Length: the limit is enforced while reading
        for _ in range(3):
            yield b"a" * (1 << 20)

    r = client.post("/v1/completions", content=chunks())
    assert r.status_code == 413


def test_prompt_over_limits_reports_counts(client: httpx.Client, model: str,
                                           tiny_gateway: Any, redis_url: str) -> None:
    r = client.post("/v1/completions", json={"model": model, "prompt": [1] * 201})
    err = r.json()["error"]
    assert r.status_code == 400 and "201" in err["message"] and "200" in err["message"]
    # a tenant without its own limits runs into the model's context (512 here)
    assert tiny_gateway.engine.max_model_len == 512
    free_key = make_tenant(redis_url, tiny_gateway.config.namespace, "unlimited")
    headers = {"Authorization": f"Bearer {free_key}"}
    r = client.post("/v1/completions", headers=headers,
                    json={"model": model, "prompt": [1] * 500, "max_tokens": 64})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert "564" in err["message"] and "500" in err["message"] and "64" in err["message"]
    r = client.post("/v1/completions", headers=headers, json={"model": model, "prompt": [1] * 512})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = client.post("/v1/completions", headers=headers,
                    json={"model": model, "prompt": [1] * 500, "max_tokens": 12})
    assert r.status_code == 200, r.text


def test_unknown_model_404(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "gpt-17", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_auth_errors(tiny_gateway: Any, model: str) -> None:
    body = {"model": model, "prompt": "x"}
    for headers in ({}, {"Authorization": "Bearer cp-not-a-real-key-123456"},
                    {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}):
        r = httpx.post(tiny_gateway.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["type"] == "authentication_error"
    r = httpx.get(tiny_gateway.url + "/v1/models")
    assert r.status_code == 401


def test_tier_not_allowed_403(client: httpx.Client, model: str) -> None:
    r = client.post("/v1/completions", json={"model": model, "prompt": "x",
                                             "service_tier": "best-effort"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = client.post("/v1/completions", json={"model": model, "prompt": "x"},
                    headers={"X-Carpool-Tier": "best-effort"})
    assert r.status_code == 403


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert client.get("/v1/nope").status_code == 404
    r = client.post("/admin/nope", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
