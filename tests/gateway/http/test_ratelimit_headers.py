"""OpenAI's x-ratelimit-* headers, read by the official ``openai`` client's
``with_raw_response``: on answers, on streams and on 429s (which keep Retry-After), computed by
the admitting Lua call (its bucket levels, so every gateway sends the same view)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway.harness import openai_client

pytestmark = pytest.mark.timeout(60)
NAMES = [f"x-ratelimit-{w}-{k}" for k in ("requests", "tokens")
         for w in ("limit", "remaining", "reset")]


def test_headers_on_answer_stream_and_429(echo_gateway: Any, redis_url: str) -> None:
    with openai_client(echo_gateway, redis_url, "hdrs", rpm=3, tpm=1000) as client:
        raw = client.completions.with_raw_response.create(model="echo", prompt="a b c",
                                                          max_tokens=5)
        h = raw.headers
        assert all(n in h for n in NAMES), dict(h)
        assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-limit-tokens"]) == ("3", "1000")
        # this request took one request and reserved 3 + 5 tokens, from full buckets
        assert h["x-ratelimit-remaining-requests"] == "2"
        assert h["x-ratelimit-remaining-tokens"] == "992"
        assert h["x-ratelimit-reset-requests"] == "20s"  # 1 of 3/min refills in 20 s
        assert raw.parse().usage.completion_tokens == 5
        stream = client.completions.with_raw_response.create(
            model="echo", prompt="a b c", max_tokens=5, stream=True)
        assert int(stream.headers["x-ratelimit-remaining-requests"]) == 1
        assert "".join(c.choices[0].text for c in stream.parse() if c.choices)
        client.completions.create(model="echo", prompt="a", max_tokens=1)
        with pytest.raises(openai.RateLimitError) as err:
            client.completions.with_raw_response.create(model="echo", prompt="a", max_tokens=1)
        h = err.value.response.headers
        assert err.value.status_code == 429 and int(h["retry-after"]) >= 1
        assert h["x-ratelimit-remaining-requests"] == "0"
        assert h["x-ratelimit-limit-tokens"] == "1000"


def test_unlimited_tenant_sends_none(echo_gateway: Any, redis_url: str) -> None:
    with openai_client(echo_gateway, redis_url, "free") as client:
        raw = client.completions.with_raw_response.create(model="echo", prompt="a",
                                                          max_tokens=1)
        assert not [n for n in NAMES if n in raw.headers]
