"""The figures of ``carpool bench serve``: one ``Trace`` per request, one ``Row`` per server
(or the offline engine), one table.

A trace holds when the request was sent and the time of each content event (a streamed
answer) or of each step that produced its tokens (offline). From it: latency (last token -
sent), TTFT (first - sent) and the inter-token latencies (gaps between consecutive events; an
event carrying several tokens counts as one gap). Percentiles are nearest-rank over every
request's (TTFT) or every gap's (ITL) values pooled across the row. Useful tokens are the ones
received; a request that got fewer than it asked for (an early EOS: a server that ignores
``ignore_eos``, or an error) is counted in ``short_ended`` and named in the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Trace:
    sent: float
    asked: int
    times: list[float] = field(default_factory=list)
    tokens: int = 0  # received (the usage count when the server sent one, else one per event)
    error: str = ""

    @property
    def latency(self) -> float:
        return (self.times[-1] if self.times else math.nan) - self.sent

    @property
    def ttft(self) -> float:
        return (self.times[0] if self.times else math.nan) - self.sent

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]


@dataclass
class Row:
    name: str
    wall_s: float
    traces: list[Trace]
    note: str = ""
    server: str = ""  # which server (and configuration) made the row: the comparison's column
    streams: int = 0  # N of an N-streams row; 0 for the seed workload

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.traces)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def short_ended(self) -> int:
        return sum(1 for t in self.traces if t.tokens < t.asked or t.error)

    def mean_latency(self, short: bool) -> float:
        """Mean latency of the requests asking for the fewest (short) or most (long) tokens."""
        if not self.traces:
            return math.nan
        asked = [t.asked for t in self.traces]
        cut = min(asked) if short else max(asked)
        vals = [t.latency for t in self.traces if t.asked == cut and t.times]
        return sum(vals) / len(vals) if vals else math.nan

    def ttft(self, q: float) -> float:
        return percentile([t.ttft for t in self.traces if t.times], q)

    def itl(self, q: float) -> float:
        return percentile([g for t in self.traces for g in t.gaps()], q)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


COLUMNS = ("row", "n", "wall s", "tok/s", "x offline", "short lat s", "long lat s",
           "TTFT p50 s", "TTFT p99 s", "ITL p50 ms", "ITL p99 ms", "short-ended")


def table(rows: list[Row], offline: Row | None) -> str:
    """A Markdown table of ``rows``; ``x offline`` is each row's tok/s over ``offline``'s. A
    figure that does not exist (no offline row; no request of a kind) is "-"."""
    base = offline.tok_s if offline is not None else math.nan
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [r.name, str(len(r.traces)), f"{r.wall_s:.1f}", f"{r.tok_s:.1f}",
                 fmt(r.tok_s / base, "{:.2f}"), fmt(r.mean_latency(True), "{:.2f}"),
                 fmt(r.mean_latency(False), "{:.2f}"), fmt(r.ttft(50), "{:.2f}"),
                 fmt(r.ttft(99), "{:.2f}"), fmt(1000 * r.itl(50), "{:.0f}"),
                 fmt(1000 * r.itl(99), "{:.0f}"), str(r.short_ended)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"{r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + notes)


def fmt(value: float, spec: str) -> str:
    """``spec`` applied to ``value``; "-" for a figure that does not exist (nan)."""
    return "-" if math.isnan(value) else spec.format(value)
