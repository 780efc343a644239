"""Quotas over real HTTP and Redis: rpm and tpm bursts get 429 + Retry-After naming the limit,
admitted tokens stay within quota + one request's max_tokens, concurrency and queue caps."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.gateway.harness import make_tenant
from tests.gateway.worker.drainer_hold import start_drainer, stop_drainer

pytestmark = pytest.mark.timeout(60)


async def burst(url: str, key: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=30) as c:
        return list(await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies)))


def assert_429(r: httpx.Response, code: str, words: str) -> None:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == code
    assert words in err["message"]


def test_rpm_burst(echo_gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, echo_gateway.config.namespace, "rpm5", rpm=5)
    res = asyncio.run(burst(echo_gateway.url, key, [{"model": "echo", "prompt": "hi",
                                                      "max_tokens": 1}] * 9))
    ok = [r for r in res if r.status_code == 200]
    assert len(ok) == 5
    for r in res:
        if r.status_code != 200:
            assert_429(r, "rpm", "requests per minute")
            assert int(r.headers["retry-after"]) <= 12  # one request refills in 60/5 s


def test_tpm_burst_admitted_tokens_bounded(echo_gateway: Any, redis_url: str) -> None:
    tpm, max_tokens = 400, 40
    key = make_tenant(redis_url, echo_gateway.config.namespace, "tpm400", tpm=tpm)
    bodies = [{"model": "echo", "prompt": "a b c", "max_tokens": max_tokens}] * 20
    res = asyncio.run(burst(echo_gateway.url, key, bodies))
    ok = [r for r in res if r.status_code == 200]
    rejected = [r for r in res if r.status_code != 200]
    assert ok and rejected
    for r in rejected:
        assert_429(r, "tpm", "tokens per minute")
    used = sum(r.json()["usage"]["total_tokens"] for r in ok)
    assert used <= tpm + max_tokens
    assert len(ok) == tpm // (3 + max_tokens)  # reservations of 43 fit 9 times in 400


def test_reservation_larger_than_tpm_is_400(echo_gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, echo_gateway.config.namespace, "tiny-tpm", tpm=20)
    r = httpx.post(echo_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "echo", "prompt": "a b c", "max_tokens": 30})
    assert r.status_code == 400 and r.json()["error"]["code"] == "tpm_too_small"


def test_concurrency_cap_and_release(echo_gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, echo_gateway.config.namespace, "conc2", max_concurrency=2)
    # 2 ms steps x 150 tokens: each request holds its slot for ~0.3 s
    bodies = [{"model": "echo", "prompt": "x y", "max_tokens": 150}] * 6
    res = asyncio.run(burst(echo_gateway.url, key, bodies))
    assert sum(r.status_code == 200 for r in res) == 2
    for r in res:
        if r.status_code != 200:
            assert_429(r, "concurrency", "concurrent")
    # slots were released at the end: the next ones are admitted
    res = asyncio.run(burst(echo_gateway.url, key, bodies[:2]))
    assert [r.status_code for r in res] == [200, 200]


def test_queue_full_is_429(echo_gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, echo_gateway.config.namespace, "q")
    quota = echo_gateway.services.quota
    quota.queue_max_len, cap = 4, quota.queue_max_len
    stop_drainer(echo_gateway)
    try:
        bodies = [{"model": "echo", "prompt": "x", "max_tokens": 2, "stream": True}] * 6

        async def go() -> list[int]:
            async with httpx.AsyncClient(base_url=echo_gateway.url, timeout=30,
                                         headers={"Authorization": f"Bearer {key}"}) as c:
                streams = [c.stream("POST", "/v1/completions", json=b) for b in bodies]
                opened = [await s.__aenter__() for s in streams]
                codes = [r.status_code for r in opened]
                full = next(r for r in opened if r.status_code == 429)
                await full.aread()
                assert_429_json(full)
                start_drainer(echo_gateway)
                for s, r in zip(streams, opened):
                    await r.aread()
                    await s.__aexit__(None, None, None)
                return codes

        codes = asyncio.run(go())
    finally:
        start_drainer(echo_gateway)
        quota.queue_max_len = cap
    assert codes.count(200) == 4 and codes.count(429) == len(bodies) - 4


def assert_429_json(r: httpx.Response) -> None:
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["retry-after"]) >= 1
