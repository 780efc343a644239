"""The conclusions of ``carpool bench serve`` from rows made here (random traces): guidellm's
table cells are each row's tokens / window and numpy's nearest-rank ITL median; the targets
say met exactly when a plain comparison of those figures says so; the seed ratios name the
fastest Carpool row and fp32 against the best llama-server row; the main table prints "-"
for "x offline" without an offline row."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gateway.bench.serve_compare import seed_ratios, streams_table, streams_targets
from gateway.bench.serve_rows import Row, Trace, table

LEVELS = (1, 8, 32)


def _row(server: str, streams: int, rng: random.Random, speed: float) -> Row:
    """``streams`` requests of 10-30 tokens, gaps drawn around 1/``speed`` s, in a window
    that shrinks as ``speed`` grows (tok/s about ``speed`` x streams / 10)."""
    traces = []
    for _ in range(max(streams, 1)):
        t, times = rng.uniform(0, 0.5), []
        for _ in range(rng.randint(10, 30)):
            t += rng.uniform(0.5, 1.5) / speed
            times.append(t)
        traces.append(Trace(0.0, len(times), times, len(times)))
    return Row(f"{server}, {streams} streams", rng.uniform(150, 250) / speed, traces, server=server,
               streams=streams)


def _ref(row: Row) -> tuple[float, float]:
    tok_s = sum(t.tokens for t in row.traces) / row.wall_s
    gaps = [b - a for t in row.traces for a, b in zip(t.times, t.times[1:])]
    return tok_s, 1000 * float(np.percentile(gaps, 50, method="inverted_cdf"))


SERVERS = ("Carpool fp32", "llama-server Q4_1, 64 slots", "llama-server F32, 64 slots")


@pytest.mark.parametrize("seed", range(8))
def test_streams_table_and_targets_are_the_plain_comparison(seed: int) -> None:
    rng = random.Random(seed)
    speeds = {s: rng.uniform(5, 50) for s in SERVERS}
    rows = [_row(s, n, rng, speeds[s]) for s in SERVERS for n in LEVELS]
    rows.append(Row("seed row", 1.0, [], server="Carpool fp32"))  # not a streams row
    lines = streams_table(rows).splitlines()
    assert lines[0] == ("| streams | " + " | ".join(f"{s}: out tok/s / ITL p50" for s in SERVERS)
                        + " |")
    by = {(r.server, r.streams): _ref(r) for r in rows if r.streams}
    for line, n in zip(lines[2:], LEVELS, strict=True):
        cells = [f"{by[s, n][0]:.1f} / {by[s, n][1]:.0f} ms" for s in SERVERS]
        assert line == f"| {n} | " + " | ".join(cells) + " |"
    tok_line, itl_line = streams_targets(rows)
    f32 = SERVERS[2]
    tok_met = all(by[SERVERS[0], n][0] >= by[f32, n][0] for n in LEVELS)
    itl_met = by[SERVERS[0], 1][1] <= by[f32, 1][1]
    assert tok_line.startswith(f"Carpool fp32 out tok/s >= {f32} at every level: "
                               + ("met" if tok_met else "MISSED"))
    assert itl_line.startswith(f"Carpool fp32 ITL p50 at 1 stream <= {f32}: "
                               + ("met" if itl_met else "MISSED"))


def test_int8_is_also_held_against_q8_0() -> None:
    rng = random.Random(1)
    servers = ("Carpool fp32", "Carpool int8", "llama-server F32, 64 slots",
               "llama-server Q8_0, 64 slots")
    rows = [_row(s, n, rng, 10 + 5 * i) for i, s in enumerate(servers) for n in LEVELS]
    heads = [line.split(":")[0] for line in streams_targets(rows)]
    assert heads == [line for c, ref in (("Carpool fp32", servers[2]),
                                         ("Carpool int8", servers[2]),
                                         ("Carpool int8", servers[3]))
                     for line in (f"{c} out tok/s >= {ref} at every level",
                                  f"{c} ITL p50 at 1 stream <= {ref}")]


def test_no_streams_rows_or_no_f32_reference() -> None:
    rng = random.Random(0)
    assert streams_table([Row("seed", 1.0, [], server="Carpool fp32")]) == ""
    only_q4 = [_row("Carpool fp32", 1, rng, 10), _row(SERVERS[1], 1, rng, 10)]
    assert streams_targets(only_q4) == []
    assert "| 1 | " in streams_table(only_q4)


def _seed(server: str, tok_s: float) -> Row:
    return Row(server, 10.0, [Trace(0.0, int(tok_s * 10), [1.0], int(tok_s * 10))], server=server)


def test_seed_ratios_fastest_and_fp32_against_the_best_llama_row() -> None:
    rows = [_seed("Carpool offline", 200), _seed("Carpool fp32", 190), _seed("Carpool int8", 300),
            _seed("llama-server Q4_1, 16 slots", 150), _seed("llama-server Q4_1, 64 slots", 120),
            _seed("llama-server F32, 64 slots", 100), _row("Carpool int8", 8, random.Random(1), 99)]
    lines = seed_ratios(rows)
    assert lines[0].startswith(f"served / offline (fp32) = {190 / 200:.2f}")
    assert lines[1].startswith(f"served / best llama-server = {300 / 150:.2f}  (fastest Carpool: "
                               "Carpool int8")
    assert "llama-server Q4_1, 16 slots" in lines[1]
    assert lines[2].startswith(f"served / best llama-server = {190 / 150:.2f}  (fp32: ")
    # fp32 the fastest: one line for it; no llama rows: no such line
    assert len(seed_ratios(rows[:2] + rows[3:4])) == 2
    assert seed_ratios(rows[:3]) == [lines[0]]


def test_x_offline_is_a_dash_without_an_offline_row() -> None:
    row = _seed("Carpool fp32", 100)
    assert table([row], None).splitlines()[2].split(" | ")[4] == "-"
    offline = _seed("Carpool offline", 50)
    assert table([row], offline).splitlines()[2].split(" | ")[4] == "2.00"
