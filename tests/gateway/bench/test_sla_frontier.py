"""The step-cost frontier of ``carpool bench sla`` against brute-force references: operating
points made from a known law give that law back and the light tier's reach equals a scan over
row counts; the server-law bulk reach equals a schedule priced step by step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gateway.bench.sla_frontier import (
    MachineLaw,
    Point,
    Work,
    busy_share,
    fit,
    law_reach,
    light_reach,
    ttft_growth_s,
)


def point_of(a: float, b: float, rows: float) -> Point:
    step = a + b * rows
    return Point(step, rows / step)  # each row one token a step


def scan_tokens(a: float, b: float, max_step: float) -> float:
    """The most tokens/s of any batch (rows in 0.001 steps) whose step stays within."""
    best, rows = 0.0, 0.0
    while a + b * rows <= max_step:
        best = max(best, rows / (a + b * rows))
        rows += 0.001
    return best


@pytest.mark.parametrize(("a", "b"), [(0.100, 0.011), (0.120, 0.0044), (0.05, 0.002)])
def test_fit_gives_the_law_back_and_the_light_reach_equals_a_scan(a: float, b: float) -> None:
    law = fit(point_of(a, b, 6), point_of(a, b, 60))
    assert law is not None
    assert law.base_s == pytest.approx(a) and law.per_row_s == pytest.approx(b)
    light, heavy = point_of(a, b, 3), point_of(a, b, 80)
    fair = light_reach(light, heavy)
    assert fair is not None
    assert fair.tokens_s == pytest.approx(scan_tokens(a, b, 1.2 * light.step_s), rel=1e-3)
    assert fair.of_heavy == pytest.approx(fair.tokens_s / heavy.tokens_s)
    assert a + b * fair.rows == pytest.approx(1.2 * light.step_s)
    assert fair.heavy_rows == pytest.approx(80)
    # the heavy batch's tokens/s over what a batch of a billion rows would yield
    huge = point_of(a, b, 1e9)
    assert fair.heavy_of_asymptote == pytest.approx(heavy.tokens_s / huge.tokens_s, rel=1e-6)
    assert ttft_growth_s(light, heavy) == pytest.approx(2 * b * (80 - 3))


def test_no_law_from_points_that_do_not_rise() -> None:
    assert fit(Point(0.2, 50), Point(0.2, 80)) is None  # same step, more rows
    assert fit(Point(0.3, 50), Point(0.2, 40)) is None  # fewer rows in the larger row
    assert light_reach(Point(0.3, 50), Point(0.2, 40)) is None


def schedule_seconds(law: MachineLaw, steps: int, decode_rows: list[int],
                     prompts: list[list[tuple[int, int]]]) -> float:
    """Seconds ``steps`` steps take, each priced on its own: ``decode_rows[i]`` decode rows
    of ``law.kv_per_row`` context, and the prompt chunks (tokens, start position) of step i,
    each reading the context up to its end (``StepBudget.observe``'s kv_tokens)."""
    total = 0.0
    for i in range(steps):
        chunks = prompts[i]
        rows = decode_rows[i] + len(chunks)
        tokens = decode_rows[i] + sum(n for n, _ in chunks)
        kv = decode_rows[i] * law.kv_per_row + sum(n + start for n, start in chunks)
        total += (law.base_s + law.per_row_s * rows + law.per_token_s * tokens
                  + law.per_kv_token_s * kv + law.per_prefill_row_s * len(chunks))
    return total


def test_a_works_machine_time_equals_its_schedule_priced_step_by_step() -> None:
    law = MachineLaw(0.02, 0.0015, 0.0011, 2e-6, 0.018, kv_per_row=90.0, prefill_tokens=20.0)
    # a steady cycle of 12 steps: 3 interactive requests of 4 output tokens (a 40-token prompt,
    # whole) and 2 bulk ones of 6 (a 50-token prompt in chunks of 20, 20 and 10) start per
    # cycle, so 3 x 4 - 3 interactive and 2 x 6 - 2 bulk decode rows run in it (each request's
    # first token comes from its prompt's last chunk)
    steps = 12
    chunks = [(40, 0)] * 3 + [(20, 0), (20, 20), (10, 40)] * 2
    prompts: list[list[tuple[int, int]]] = [[] for _ in range(steps)]
    for i, c in enumerate(chunks):
        prompts[(5 * i) % steps].append(c)
    decode = [0] * steps
    for i in range(3 * 3 + 2 * 5):
        decode[i % steps] += 1
    seconds = schedule_seconds(law, steps, decode, prompts)
    step = seconds / steps
    inter = Work(3 * 4 / seconds, 40, 4)
    bulk = Work(2 * 6 / seconds, 50, 6, chunk_tokens=law.prefill_tokens)
    assert busy_share(law, step, [inter, bulk]) == pytest.approx(1.0)
    # the reach at that step is exactly that bulk, and asking for it needs that step
    reach = law_reach(law, step / 1.3, inter, bulk, fcfs_bulk_s=bulk.tokens_s / 0.8)
    assert reach is not None
    assert reach.bulk_tokens_s == pytest.approx(bulk.tokens_s)
    assert reach.of_fcfs == pytest.approx(0.8)
    assert reach.tpot_ratio_needed == pytest.approx(1.3)
    # priced as one chunk, the same bulk would look cheaper: the chunks' rows and re-reads
    assert Work(1, 50, 6).seconds_per_token(law) < bulk.seconds_per_token(law)


def test_the_reach_grows_with_the_step_and_is_none_without_figures() -> None:
    law = MachineLaw(0.02, 0.0015, 0.0011, 2e-6, 0.018, kv_per_row=90.0)
    inter, bulk = Work(30.0, 44, 48), Work(0.0, 44, 48)
    reach = [law_reach(law, 0.035, inter, bulk, 60.0, tpot_limit=x) for x in (1.1, 1.3, 2.0)]
    tokens = [r.bulk_tokens_s for r in reach if r is not None]
    assert len(tokens) == 3 and tokens[0] < tokens[1] < tokens[2]
    # interactive alone fills a machine at a step this short: nothing is left for bulk
    squeezed = law_reach(law, 0.021 / 1.3, inter, bulk, 60.0)
    assert squeezed is not None and squeezed.bulk_tokens_s == 0.0
    # bulk past what the law can ever run beside interactive needs an endless step
    endless = law_reach(law, 0.035, inter, bulk, 1e4)
    assert endless is not None and math.isinf(endless.tpot_ratio_needed)
    assert law_reach(law, 0.035, inter, bulk, 0.0) is None
    assert MachineLaw.of(None) is None
    published = {"base_s": 0.02, "per_row_s": 0.0015, "per_token_s": 0.0011,
                  "per_kv_token_s": 2e-6, "per_prefill_row_s": 0.018, "kv_per_row": 90.0,
                  "prefill_tokens": 44.0, "steps": 512}
    assert MachineLaw.of(published) == replace(law, prefill_tokens=44.0)
