"""The table of ``carpool bench sla``: per-row figures computed from the calls a row made,
and the issue's targets as ratios between rows of the same run (pure functions, no I/O).

Percentiles are nearest-rank. A probe call that never got a first token before the row's
grace ran out counts with the time it had waited (a lower bound), so a starved request
raises p99 instead of vanishing from it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gateway.bench.sla_client import Call
from gateway.bench.sla_frontier import (
    LawReach,
    MachineLaw,
    Point,
    Work,
    law_reach,
    light_reach,
    ttft_growth_s,
)
from gateway.bench.sla_load import RowRun
from gateway.bench.sla_split import TierBudget
from policies.tiers import DERIVED_TPOT_HEADROOM, TPOT_PROMISE

BULK = ("batch", "best-effort")


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` in [0, 1] of ``values`` (nan when empty)."""
    data = sorted(values)
    if not data:
        return math.nan
    return data[max(0, math.ceil(q * len(data)) - 1)]


def ttfts_ms(calls: Sequence[Call], cut_at: float) -> list[float]:
    """TTFT of each admitted call in ms; one cut short before its first token counts as
    its wait until ``cut_at``. Shed calls (answered at once with 429/503) are not latency."""
    out = []
    for c in calls:
        if c.ttft is not None:
            out.append(c.ttft * 1000)
        elif c.cancelled and c.status in (0, 200):
            out.append((cut_at - c.sent) * 1000)
    return out


@dataclass
class Row:
    name: str
    run: RowRun
    cut_at: float  # when the row cut its open calls
    kv_used: float  # carpool_kv_blocks{state="used"} after the drain
    queue_left: int  # entries left in the queue streams after the drain
    server_requests: float  # carpool_requests_total gained during the row (drain included)
    law: dict[str, float] | None = None  # the server's fitted step law after the row
    # the row's TTFT budget per tier (``sla_split``), the preemptions the server counted in it,
    # and interactive's TPOT target the worker held while it ran (seconds, the median read)
    budget: dict[str, TierBudget] = field(default_factory=dict)
    preemptions: float = 0.0
    tpot_target_s: float | None = None

    def ttft_steps_p99(self, tier: str = "interactive") -> float:
        b = self.budget.get(tier)
        return math.nan if b is None or b.steps_p99 is None else b.steps_p99

    def ttft_ms(self, stream: str, q: float) -> float:
        return pct(ttfts_ms(self.run.of(stream), self.cut_at), q)

    def tpot_ms(self, stream: str, q: float) -> float:
        return pct([c.tpot * 1000 for c in self.run.of(stream) if c.tpot is not None], q)

    @property
    def bulk_goodput(self) -> float:
        """Batch + best-effort output tokens per second of the offering window."""
        return self.run.window_tokens(*BULK) / (self.run.end - self.run.start)

    @property
    def be_share(self) -> float:
        """Best-effort's share of all output tokens in the window (nan without best-effort)."""
        total = self.run.window_tokens(*{c.tenant for c in self.run.calls})
        if not self.run.of("best-effort") or total <= 0:
            return math.nan
        return self.run.window_tokens("best-effort") / total

    @property
    def count_5xx(self) -> int:
        return sum(c.is_5xx for c in self.run.calls)

    @property
    def shed(self) -> int:
        return sum(c.shed for c in self.run.calls)

    @property
    def errors(self) -> int:
        """Failures that are neither 5xx nor shedding: transport errors, other 4xx, error
        events, streams that ended without [DONE] (a call the bench cut short is none)."""
        return sum(1 for c in self.run.calls if not (c.is_5xx or c.shed or c.cancelled)
                   and (c.error or c.status != 200 or not c.done))

    @property
    def admitted(self) -> int:
        """Calls the server took in (a 200 status line): each ends in carpool_requests_total."""
        return sum(c.status == 200 for c in self.run.calls)


COLUMNS = ("row", "calls", "int. TTFT p50 ms", "int. TTFT p99 ms", "int. TTFT p99 steps",
           "int. TPOT p50 ms",
           "bulk goodput tok/s", "light TTFT p99 ms", "BE share", "5xx", "shed", "errors",
           "KV used at end", "queue left")


def row_cells(row: Row) -> list[str]:
    return [row.name, str(len(row.run.calls)), _f(row.ttft_ms("interactive", 0.5)),
            _f(row.ttft_ms("interactive", 0.99)), _f(row.ttft_steps_p99()),
            _f(row.tpot_ms("interactive", 0.5)),
            _f(row.bulk_goodput, 1) if row.run.of(*BULK) else "-",
            _f(row.ttft_ms("light", 0.99)), _f(row.be_share, 3), str(row.count_5xx),
            str(row.shed), str(row.errors), f"{row.kv_used:.0f}", str(row.queue_left)]


def _f(x: float, digits: int = 0) -> str:
    return "-" if math.isnan(x) else f"{x:,.{digits}f}"


def table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def shares_line(row: Row, weights: Mapping[str, int]) -> str:
    """Each tier's share of ``row``'s output tokens in the window and of the calls that
    finished in it, beside its WRR share (the streams are named after their tiers)."""
    tiers = [t for t in weights if row.run.of(t)]
    tokens = {t: row.run.window_tokens(t) for t in tiers}
    done = {t: sum(c.done and c.last is not None and c.last <= row.run.end
                   for c in row.run.of(t)) for t in tiers}
    total_w = sum(weights[t] for t in tiers) or 1
    parts = [f"{t} {_share(tokens[t], tokens.values())} of tokens, "
             f"{_share(done[t], done.values())} of completions (WRR {weights[t] / total_w:.3f})"
             for t in tiers]
    return f"{row.name} row shares: " + "; ".join(parts)


def _share(x: float, values: Iterable[float]) -> str:
    total = sum(values)
    return f"{x / total:.3f}" if total > 0 else "-"


@dataclass(frozen=True)
class Target:
    what: str
    value: float
    limit: float
    at_most: bool  # met when value <= limit (else when value >= limit)

    @property
    def met(self) -> bool:
        return not math.isnan(self.value) and (
            self.value <= self.limit if self.at_most else self.value >= self.limit)


def targets(rows: dict[str, Row], be_wrr_share: float) -> list[Target]:
    """The issue's targets from the named rows (those absent are skipped)."""
    out: list[Target] = []
    alone, over, fcfs = rows.get("alone"), rows.get("overload"), rows.get("fcfs")
    for key, label in (("overload", ""), ("overload32", " (--max-num-seqs row)")):
        row = rows.get(key)
        if alone is None or row is None:
            continue
        out.append(Target(f"int. TTFT p99 overload{label} / alone",
                          _ratio(row.ttft_ms("interactive", 0.99),
                                 alone.ttft_ms("interactive", 0.99)), 1.5, True))
        out.append(Target(f"int. TPOT p50 overload{label} / alone",
                          _ratio(row.tpot_ms("interactive", 0.5),
                                 alone.tpot_ms("interactive", 0.5)), TPOT_PROMISE, True))
    if over is not None and fcfs is not None:
        out.append(Target("int. TTFT p99 overload / FCFS", _ratio(
            over.ttft_ms("interactive", 0.99), fcfs.ttft_ms("interactive", 0.99)), 0.5, True))
        out.append(Target("bulk goodput overload / FCFS",
                          _ratio(over.bulk_goodput, fcfs.bulk_goodput), 0.8, False))
        # what can hold: the server's own law prices the bulk within the TPOT the budget
        # aims at (DERIVED_TPOT_HEADROOM x alone, under the 1.3x promise to absorb its own
        # error); the reach at the promise itself is in the law's line below the table
        reach = server_reach(rows, DERIVED_TPOT_HEADROOM)
        if reach is not None:
            out.append(Target(
                f"bulk goodput overload / law's reach at the budget's {DERIVED_TPOT_HEADROOM:g}x",
                _ratio(over.bulk_goodput, reach.bulk_tokens_s), 0.8, False))
    light, heavy = rows.get("light"), rows.get("heavy")
    if light is not None and heavy is not None:
        out.append(Target("light TTFT p99 with 10x heavy / alone", _ratio(
            heavy.ttft_ms("light", 0.99), light.ttft_ms("light", 0.99)), 1.2, True))
        # what can hold: a first token beside the heavy batch waits for its longer steps
        # (sla_frontier.ttft_growth_s), from this run's own two rows; the p99 first token
        # meets the longest steps, so the heavy side is the light calls' TPOT p99
        growth_ms = 1000 * ttft_growth_s(_point(light, "light"),
                                         _point(heavy, "light", q=0.99))
        out.append(Target("light TTFT p99 with heavy / (alone + 2 x step growth)", _ratio(
            heavy.ttft_ms("light", 0.99), light.ttft_ms("light", 0.99) + growth_ms),
            1.2, True))
    backlog = rows.get("backlog")
    if backlog is not None:
        out.append(Target("BE share / WRR share, all backlogged",
                          _ratio(backlog.be_share, be_wrr_share), 0.5, False))
    return out + hygiene(list(rows.values()))


def hygiene(every: Sequence[Row]) -> list[Target]:
    """What every run must end with: no 5xx, no KV block held, no queue entry left."""
    return [Target("5xx, all rows", sum(r.count_5xx for r in every), 0, True),
            Target("KV blocks used after drain, max", max(r.kv_used for r in every), 0, True),
            Target("queue entries left, max", max(r.queue_left for r in every), 0, True)]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(b) else math.nan


def targets_table(items: Sequence[Target]) -> str:
    lines = ["| target | value | limit | |", "|---|---|---|---|"]
    for t in items:
        lines.append(f"| {t.what} | {_f(t.value, 2)} | {'<=' if t.at_most else '>='} "
                     f"{t.limit:g} | {'met' if t.met else 'MISSED'} |")
    return "\n".join(lines)


def _point(row: Row, stream: str, q: float = 0.5) -> Point:
    names = {c.tenant for c in row.run.calls}
    return Point(row.tpot_ms(stream, q) / 1000,
                 row.run.window_tokens(*names) / (row.run.end - row.run.start))


def work(row: Row, *streams: str) -> Work | None:
    """What ``streams`` offered in ``row``: output tokens/s in the window, and the mean
    prompt and output tokens of their calls that ran to their end (None: none did)."""
    done = [c for c in row.run.of(*streams) if c.done and c.prompt_tokens is not None]
    if not done:
        return None
    return Work(row.run.window_tokens(*streams) / (row.run.end - row.run.start),
                sum(c.prompt_tokens or 0 for c in done) / len(done),
                sum(c.output_tokens for c in done) / len(done))


def work_in_chunks(row: Row, law: MachineLaw | None, *streams: str) -> Work | None:
    """``work``, its prompts in the chunks the server's prompt rows computed on average
    (the step budget chunks lower-tier prompts under overload)."""
    w = work(row, *streams)
    if w is None or law is None or law.prefill_tokens <= 0:
        return w
    return replace(w, chunk_tokens=law.prefill_tokens)


def server_reach(rows: dict[str, Row], tpot_limit: float = TPOT_PROMISE) -> LawReach | None:
    """Bulk goodput the server's own step law (read after the overload row) allows beside
    the overload row's interactive work at ``tpot_limit`` x its alone TPOT
    (``sla_frontier.law_reach``); None without the rows, a warm law or finished calls."""
    alone, over, fcfs = rows.get("alone"), rows.get("overload"), rows.get("fcfs")
    if alone is None or over is None or fcfs is None:
        return None
    law = MachineLaw.of(over.law)
    inter, bulk = work(over, "interactive"), work_in_chunks(over, law, *BULK)
    if law is None or inter is None or bulk is None:
        return None
    return law_reach(law, alone.tpot_ms("interactive", 0.5) / 1000, inter, bulk,
                     fcfs.bulk_goodput, tpot_limit)


def frontier_lines(rows: dict[str, Row]) -> list[str]:
    """What the step-cost law of this run lets the bulk and light targets reach
    (``sla_frontier``); empty without the rows it needs."""
    lines = _law_lines(rows)
    light, heavy = rows.get("light"), rows.get("heavy")
    if light is not None and heavy is not None:
        lines += _light_lines(light, heavy)
    return lines


def _law_lines(rows: dict[str, Row]) -> list[str]:
    reach = server_reach(rows)
    # the step budget aims at the derived target, under the promise (policies.tiers)
    aimed = server_reach(rows, DERIVED_TPOT_HEADROOM)
    if reach is None or aimed is None:
        return []
    law, inter, bulk = reach.law, reach.interactive, reach.bulk
    return [(f"server's step law after the overload row: step ~ {law.base_s * 1000:.1f} ms + "
             f"{law.decode_row_s * 1000:.2f} ms a decode row ({law.kv_per_row:.0f} context) + "
             f"{law.prompt_s(bulk.prompt_tokens, bulk.chunk_tokens) * 1000:.1f} ms a "
             f"{bulk.prompt_tokens:.0f}-token bulk prompt in {law.prefill_tokens:.0f}-token "
             f"chunks; interactive's {inter.tokens_s:.1f} tok/s take "
             f"{inter.busy_s(law):.2f} of each second; within {reach.step_s * 1000:.0f} ms steps "
             f"({TPOT_PROMISE:g}x alone TPOT) bulk can reach {reach.bulk_tokens_s:.1f} tok/s "
             f"({bulk.seconds_per_token(law) * 1000:.1f} ms a token with its prompt) = "
             f"{reach.of_fcfs:.2f} of FCFS ({aimed.bulk_tokens_s:.1f} = {aimed.of_fcfs:.2f} "
             f"within the budget's {DERIVED_TPOT_HEADROOM:g}x); bulk >= 0.8x FCFS needs "
             f"interactive TPOT {reach.tpot_ratio_needed:.2f}x alone")]


def _light_lines(light: Row, heavy: Row) -> list[str]:
    small, large = _point(light, "light"), _point(heavy, "light")
    fair = light_reach(small, large)
    if fair is None:
        return []
    law = fair.law
    reach = (f"tier law from the light and heavy rows: step ~ {law.base_s * 1000:.0f} ms + "
             f"{law.per_row_s * 1000:.1f} ms/row; light TTFT <= 1.2x alone needs the tier's "
             f"batch held to {fair.rows:.1f} rows: {fair.tokens_s:.1f} tok/s = "
             f"{fair.of_heavy:.2f} of the heavy row's {large.tokens_s:.1f}")
    bound = (f"the heavy row ran ~{fair.heavy_rows:.0f} rows a step of "
             f"{large.step_s * 1000:.0f} ms (at most the worker's batch bound): "
             f"{large.tokens_s:.1f} tok/s = {fair.heavy_of_asymptote:.2f} of the law's ceiling "
             f"{1 / law.per_row_s:.1f} (given up: {1 - fair.heavy_of_asymptote:.2f}); a light first "
             f"token beside it waits >= 2 x {(large.step_s - small.step_s) * 1000:.0f} ms more "
             f"than alone (the step in progress and its own, each longer)")
    return [reach, bound]
