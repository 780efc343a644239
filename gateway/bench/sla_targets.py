"""The restated targets of ``carpool bench sla`` (issue 39): each on the law that bounds it,
printed with its measured value (pure functions of a run's rows, no I/O).

    interactive TTFT p99 (overload)  <= 1.2 x (alone p99 + 2 x step growth)
    interactive TTFT p99 in steps    <= 2, +1 when the row preempted
    interactive TPOT p50 (overload)  <= its TPOT budget (the target the worker held while
                                        the row ran, at most the one held in the alone row)
    light TTFT p99 beside heavy      <= 1.2 x (alone + 2 x step growth)
    bulk goodput (overload)          >= 0.8 x the law's reach within the TPOT budget (at
                                        most the FCFS row's bulk goodput)
    best-effort share, backlogged    >= 0.5 x its WRR share

The step growth is what a first token waits more than alone: the step in flight and its own,
each longer by how much the loaded row's steps (its TPOT p99 for the p99 first token) are
longer than alone's (TPOT p50; ``sla_frontier.ttft_growth_s``).
"""

from __future__ import annotations

import math
import statistics

from gateway.bench.sla_frontier import Point, ttft_growth_s
from gateway.bench.sla_report import Row, Target, server_reach
from policies.tiers import DERIVED_TPOT_HEADROOM

GROWTH_SLACK = 1.2  # the "1.2 x" of both TTFT targets
TTFT_STEPS = 2  # the step in flight and its own prefill step
BULK_SHARE = 0.8
BE_SHARE = 0.5


def restated_targets(rows: dict[str, Row], be_wrr_share: float) -> list[Target]:
    """The restated targets from the named rows (a target whose rows are absent is left out)."""
    out: list[Target] = []
    alone = rows.get("alone")
    for key, label in (("overload", ""), ("overload32", " (--max-num-seqs row)")):
        row = rows.get(key)
        if alone is None or row is None:
            continue
        out.append(Target(
            f"int. TTFT p99 overload{label} / (alone + 2 x step growth)",
            _ratio(row.ttft_ms("interactive", 0.99), alone.ttft_ms("interactive", 0.99)
                   + growth_ms(alone, row, "interactive")), GROWTH_SLACK, True))
        out.append(Target(f"int. TTFT p99 overload{label}, engine steps from the read",
                          row.ttft_steps_p99(), TTFT_STEPS + (row.preemptions > 0), True))
        out.append(Target(f"int. TPOT p50 overload{label} / its TPOT budget",
                          _ratio(row.tpot_ms("interactive", 0.5), budget_ms(alone, row)),
                          1.0, True))
    light, heavy = rows.get("light"), rows.get("heavy")
    if light is not None and heavy is not None:
        out.append(Target("light TTFT p99 with heavy / (alone + 2 x step growth)", _ratio(
            heavy.ttft_ms("light", 0.99),
            light.ttft_ms("light", 0.99) + growth_ms(light, heavy, "light")), GROWTH_SLACK,
            True))
    over = rows.get("overload")
    if alone is not None and over is not None:
        budget = budget_ms(alone, over)
        alone_tpot = alone.tpot_ms("interactive", 0.5)
        reach = server_reach(rows, budget / alone_tpot) if alone_tpot > 0 else None
        # no reach (no FCFS row, a cold law, no call that ran to its end): not measured, and
        # said so (nan: MISSED), not left out
        out.append(Target("bulk goodput overload / law's reach within the TPOT budget",
                          math.nan if reach is None
                          else _ratio(over.bulk_goodput, bulk_reach(reach.bulk_tokens_s, rows)),
                          BULK_SHARE, False))
    backlog = rows.get("backlog")
    if backlog is not None:
        out.append(Target("BE share / WRR share, all backlogged",
                          _ratio(backlog.be_share, be_wrr_share), BE_SHARE, False))
    return out


def bulk_reach(law_tokens_s: float, rows: dict[str, Row]) -> float:
    """The law's reach, at most the bulk goodput the FCFS row moved: no tier order gives bulk
    more than the machine moved for it with nothing protected, and a law fitted on a machine
    whose speed moves between minutes can price a reach past it (a 290 ms base, no cost a
    decode row: 2.8x the FCFS row's bulk tokens/s, measured on a shared 2-core VM)."""
    fcfs = rows.get("fcfs")
    return law_tokens_s if fcfs is None else min(law_tokens_s, fcfs.bulk_goodput)


def growth_ms(base: Row, loaded: Row, stream: str) -> float:
    """2 x how much longer ``loaded``'s steps are than ``base``'s, seen by ``stream`` (ms)."""
    return 1000 * ttft_growth_s(Point(base.tpot_ms(stream, 0.5) / 1000, 0.0),
                                Point(loaded.tpot_ms(stream, 0.99) / 1000, 0.0))


def budget_ms(alone: Row, row: Row) -> float:
    """Interactive's TPOT budget in ``row``: the target its worker held while the row ran
    (configured, or derived from interactive's step alone at the rate it asks), but never
    more than the one it held in the alone row: a derived target that rose under overload
    (the law's rows priced with the bulk's contexts) is not the promise. With no target
    read, the default headroom over alone's TPOT p50."""
    held = [t for t in (row.tpot_target_s, alone.tpot_target_s) if t]
    if held:
        return min(held) * 1000
    return DERIVED_TPOT_HEADROOM * alone.tpot_ms("interactive", 0.5)


def held_target(samples: list[tuple[float, float]], since: float, until: float
                ) -> float | None:
    """The TPOT target a row held: the median of the (time, value) samples read from
    ``since`` (the row's start plus the worker's demand window: a derived target follows the
    demand it measured over that window, which fills from nothing at the row's start) to
    ``until`` (its offering's end); all of them when none fall there (None: none read)."""
    steady = [v for t, v in samples if since <= t <= until] or [v for _, v in samples]
    return statistics.median(steady) if steady else None


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(b) else math.nan


def reach_missing(rows: dict[str, Row]) -> str | None:
    """Why the bulk target has no law's reach to compare with (None: it has one)."""
    from gateway.bench.sla_report import BULK, work

    over = rows.get("overload")
    if over is None or "alone" not in rows or "fcfs" not in rows:
        return "the alone, overload and FCFS rows are needed"
    if over.law is None:
        return "the server published no step law after the overload row (its model was cold)"
    if work(over, "interactive") is None or work(over, *BULK) is None:
        return "no interactive or no bulk call of the overload row ran to its end"
    if server_reach(rows) is None:
        return "the law prices no bulk token, or the FCFS row moved no bulk token"
    return None
