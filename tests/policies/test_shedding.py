"""Early shedding rule: checked against simulations of the queue it predicts (a tier starting
requests at its rate, first in first out, or round-robin between tenants) and against counts
over explicit queues, not against its own formulas."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from policies.shedding import (
    TENANT_OVER_SHARE,
    TIER_SATURATED,
    TierLoad,
    decide,
    fair_share,
    predicted_wait,
)
from policies.tiers import QUEUE, SHED, TierSLO

WINDOW = 10.0


def fifo_start_time(depth: int, rate: float) -> float:
    """When a request arriving behind ``depth`` others starts, with one start every 1/rate s."""
    t, ahead = 0.0, depth
    while ahead > 0:
        t += 1.0 / rate
        ahead -= 1
    return t


def wait_after(depth: int, rate: float, seconds: float) -> float:
    """The predicted wait once ``seconds`` of draining at ``rate`` (no arrivals) have passed."""
    left = max(0, depth - math.floor(rate * seconds + 1e-9))
    return fifo_start_time(left, rate) if left else 0.0


def round_robin_done(queue: list[str], tenant: str) -> float:
    """Seconds until the last of ``tenant``'s entries starts, tenants served in turn, one start
    per second."""
    left = Counter(queue)
    t = 0
    while left[tenant] > 0:
        for name in sorted(n for n, c in left.items() if c > 0):
            if left[tenant] == 0:
                break
            left[name] -= 1
            t += 1
    return float(t)


def load_of(queue: list[str], rate: float) -> TierLoad:
    return TierLoad(len(queue), rate, WINDOW, dict(Counter(queue)))


def test_predicted_wait_is_the_fifo_start_time() -> None:
    rng = random.Random(1)
    for _ in range(200):
        depth, rate = rng.randint(0, 50), rng.uniform(0.2, 20.0)
        assert predicted_wait(depth, rate, WINDOW) == pytest.approx(fifo_start_time(depth, rate))


def test_a_stalled_tier_assumes_one_start_per_window() -> None:
    assert predicted_wait(3, 0.0, WINDOW) == pytest.approx(fifo_start_time(3, 1 / WINDOW))


def test_no_status_or_empty_queue_never_sheds() -> None:
    slo = TierSLO(ttft_p99_s=0.001, action=SHED)
    assert decide(None, slo, "a", deadline_s=0.001) is None
    assert decide(TierLoad(0, 0.0, WINDOW), slo, "a", deadline_s=0.001) is None


def test_under_target_or_queue_action_or_no_target_admits() -> None:
    load = TierLoad(10, 5.0, WINDOW, {"a": 10})  # 2 s wait
    assert decide(load, TierSLO(ttft_p99_s=2.5, action=SHED), "a", 600) is None
    assert decide(load, TierSLO(ttft_p99_s=0.5, action=QUEUE), "a", 600) is None
    assert decide(load, TierSLO(action=SHED), "a", 600) is None


def test_saturated_tier_retry_after_is_when_the_wait_is_back_under_target() -> None:
    rng = random.Random(2)
    for _ in range(300):
        rate = rng.choice([0.5, 1.0, 2.0, 4.0, 7.0])
        depth = rng.randint(1, 80)
        target = rng.uniform(0.1, 10.0)
        queue = [f"t{i}" for i in range(depth)]  # one each: nobody over its share
        shed = decide(load_of(queue, rate), TierSLO(ttft_p99_s=target, action=SHED), "new",
                      deadline_s=1e9)
        if fifo_start_time(depth, rate) <= target:
            assert shed is None
            continue
        assert shed is not None and (shed.status, shed.code) == (503, TIER_SATURATED)
        assert wait_after(depth, rate, shed.retry_after_s) <= target + 1e-9
        if shed.retry_after_s > 1:  # and not much sooner: a second earlier it was still over
            assert wait_after(depth, rate, shed.retry_after_s - 1.0) > target


def test_tenant_over_its_share_gets_429_others_503() -> None:
    rng = random.Random(3)
    slo = TierSLO(ttft_p99_s=0.5, action=SHED)
    for _ in range(300):
        tenants = [f"t{i}" for i in range(rng.randint(1, 4))]
        queue = [rng.choice(tenants) for _ in range(rng.randint(2, 40))]
        me = rng.choice([*tenants, "newcomer"])
        shed = decide(load_of(queue, 1.0), slo, me, deadline_s=1e9)
        assert shed is not None  # every queue here waits >= 2 s at 1/s
        over = queue.count(me) * len(set(queue)) > len(queue)  # mine > depth / active
        assert shed.status == (429 if over else 503)
        assert shed.code == (TENANT_OVER_SHARE if over else TIER_SATURATED)
        if over:  # its queued work has all started, served in turn, by then
            assert shed.retry_after_s >= round_robin_done(queue, me)


def test_fair_share_counts_only_tenants_with_queued_work() -> None:
    assert fair_share(TierLoad(6, 1.0, WINDOW, {"a": 4, "b": 2, "c": 0})) == 3.0


@pytest.mark.parametrize("action", [SHED, QUEUE])
def test_a_wait_past_the_deadline_is_refused_in_every_tier(action: str) -> None:
    load = TierLoad(100, 1.0, WINDOW, {"a": 100})  # 100 s
    shed = decide(load, TierSLO(action=action), "a", deadline_s=60.0)
    assert shed is not None and (shed.status, shed.code) == (503, TIER_SATURATED)
    assert "deadline" in shed.message
    assert wait_after(100, 1.0, shed.retry_after_s) <= 60.0
    assert decide(load, TierSLO(action=action), "a", deadline_s=120.0) is None
