"""Token-bucket math for per-minute limits (the Lua in gateway/tenancy/quota.py mirrors it; a gateway
test runs both on the same sequences)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.rate_limit import refill, retry_after_seconds, settle, try_take


def test_new_bucket_is_full_and_burst_is_capped() -> None:
    level, admitted = None, 0
    for _ in range(100):
        d = try_take(level, 0, 0, per_minute=10, cost=1)
        if d.allowed:
            admitted += 1
            level = d.level
    assert admitted == 10


def test_refill_rate_and_retry_after() -> None:
    assert refill(0.0, 0, 6_000, per_minute=60) == 6.0
    assert refill(55.0, 0, 60_000, per_minute=60) == 60.0
    d = try_take(0.0, 0, 0, per_minute=60, cost=3)
    assert not d.allowed and d.retry_after_s == 3
    d = try_take(0.0, 0, 3_000, per_minute=60, cost=3)
    assert d.allowed and d.level == 0.0
    assert retry_after_seconds(0.0, 10_000, per_minute=600) == 60  # cost above capacity


def test_unlimited_and_settle() -> None:
    assert try_take(None, 0, 0, per_minute=0, cost=10 ** 9).allowed
    assert settle(10.0, reserved=50, actual=20, per_minute=100) == 40.0
    assert settle(90.0, reserved=50, actual=20, per_minute=100) == 100.0
    assert settle(10.0, reserved=5, actual=20, per_minute=100) == 10.0  # never an extra charge


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10_000), st.lists(st.tuples(st.integers(0, 5_000), st.integers(1, 500)),
                                        max_size=60))
def test_admitted_never_exceeds_capacity_plus_refill(limit: int,
                                                     steps: list[tuple[int, int]]) -> None:
    level: float | None = None
    last = now = 0
    admitted = 0
    for dt, cost in steps:
        now += dt
        d = try_take(level, last, now, limit, cost)
        if d.allowed:
            admitted += cost
            level, last = d.level, now
    assert admitted <= limit + now * limit / 60_000 + 1e-6


def test_reset_duration_as_openai_writes_it() -> None:
    from policies.rate_limit import reset_duration

    assert reset_duration(60, 60) == "0ms"
    assert reset_duration(59.5, 60) == "500ms"
    assert reset_duration(2, 3) == "20s"
    assert reset_duration(0, 10) == "1m0s"
    assert reset_duration(0, 1) == "1m0s" and reset_duration(0.5, 2) == "45s"


def test_ratelimit_headers() -> None:
    from policies.rate_limit import ratelimit_headers

    h = dict(ratelimit_headers(10, 4.7, 1000, -3.0))
    assert h == {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "4",
                 "x-ratelimit-reset-requests": "32s", "x-ratelimit-limit-tokens": "1000",
                 "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m0s"}
    assert ratelimit_headers(0, 0, 0, 0) == []
