"""The official ``openai`` client, unchanged, against Carpool serving SmolLM2-135M-Instruct:
chat and completions, streaming and not, and errors raised as the client's own types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.harness import make_config, make_tenant, run_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def smol(redis_url: str, smollm2_dir: Path) -> Iterator[tuple[Any, str]]:
    config = make_config(engine="real", model=str(smollm2_dir),
                         engine_options={"max_model_len": 1024, "num_blocks": 128})
    key = make_tenant(redis_url, config.namespace, "oa", max_max_tokens=64,
                      allowed_tiers=("interactive", "batch"))
    slow_key = make_tenant(redis_url, config.namespace, "oa-rpm2", rpm=2)
    with run_gateway(config, redis_url) as gw:
        gw.slow_key = slow_key
        yield gw, key


@pytest.fixture(scope="module")
def client(smol: tuple[Any, str]) -> openai.OpenAI:
    gw, key = smol
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_models_and_chat(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    assert model == "SmolLM2-135M-Instruct-Q4_1"
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20, temperature=0)
    text = resp.choices[0].message.content or ""
    assert "Paris" in text, text  # the real model, through the chat template
    assert resp.usage is not None and resp.usage.completion_tokens <= 20
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_chat_streaming_matches(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    kwargs: dict[str, Any] = {"model": model, "max_tokens": 16, "temperature": 0,
                                  "messages": [{"role": "user", "content": "Say hello."}]}
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_stream_and_not(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    full = client.completions.create(model=model, prompt="The sky is", max_tokens=8,
                                     temperature=0)
    parts = client.completions.create(model=model, prompt="The sky is", max_tokens=8,
                                      temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts) == full.choices[0].text
    assert full.usage is not None and full.usage.prompt_tokens == 3


def test_errors_are_client_exception_types(client: openai.OpenAI, smol: tuple[Any, str]) -> None:
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=msgs, n=9)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=msgs, max_tokens=65)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=msgs)  # type: ignore[arg-type]
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model=model, messages=msgs,  # type: ignore[arg-type]
                                       extra_body={"service_tier": "best-effort"})
    bad = openai.OpenAI(base_url=smol[0].url + "/v1", api_key="cp-wrong-key-000000000",
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    limited = openai.OpenAI(base_url=smol[0].url + "/v1", api_key=smol[0].slow_key,
                            max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        for _ in range(3):  # rpm 2: the third request in a burst is over the limit
            limited.completions.create(model=model, prompt="x", max_tokens=1)
    assert int(info.value.response.headers["retry-after"]) >= 1
