"""``carpool bench sla`` end to end on the FAKE echo engine with tiny durations (``--quick``):
every row and column is printed, the counts come from real requests (each admitted call is
one finished request in the server's own ``carpool_requests_total``), and the target ratios
are the rows' figures recomputed here straight from the calls. Plus the pieces on their own:
the token accounting conserves tokens, the metrics parser agrees with prometheus_client's."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.bench import sla
from gateway.bench.sla_client import Call, metric_sum, parse_metrics
from gateway.bench.sla_load import Prompts, tokens_in, tokens_per_request
from gateway.bench.sla_report import COLUMNS, Row, table, targets
from gateway.bench.sla_sweep import SweepRow, sweep_table
from gateway.bench.sla_targets import held_target, restated_targets
from policies.ttft_split import LABELS

ROWS = ("alone", "overload", "fcfs", "light", "heavy", "backlog")


@pytest.fixture(scope="module")
def quick_run() -> tuple[list[Row], float]:
    """Every row, the small-seat one (on its own warmed-up server) last."""
    return sla.run(sla.parse_args(["--engine", "echo", "--quick", "--small-seats", "8"]))


def test_table_prints_every_row_and_column(quick_run: tuple[list[Row], float]) -> None:
    rows, capacity = quick_run
    assert capacity > 0
    assert [r.name for r in rows] == [*ROWS, "overload32"]
    lines = table(rows).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(COLUMNS)
    for row, line in zip(rows, lines[2:], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS) and cells[0] == row.name


def test_counts_come_from_real_requests(quick_run: tuple[list[Row], float]) -> None:
    rows, capacity = quick_run
    args = sla.parse_args(["--engine", "echo", "--quick"])
    for row in rows:
        assert row.admitted > 0, row.name
        assert row.admitted == row.server_requests, row.name  # the server counted each one
        assert row.count_5xx == 0 and row.errors == 0, row.name
        assert row.kv_used == 0 and row.queue_left == 0, row.name
    # the offered load: a stream at rate r offers about r * duration calls in the window
    alone = rows[0].run.of("interactive")
    assert abs(len(alone) - args.interactive_x * capacity * args.duration) <= 1
    heavy = rows[ROWS.index("heavy")]
    assert len(heavy.run.of("heavy")) >= 5 * len(heavy.run.of("light"))


def test_report_prints_and_writes_the_same_figures(
        quick_run: tuple[list[Row], float], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    rows, capacity = quick_run
    args = sla.parse_args(["--engine", "echo", "--quick", "--json", str(tmp_path / "out.json")])
    sla.report(args, rows, capacity, 1.0)
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["columns"] == list(COLUMNS) and len(data["rows"]) == len(rows)
    for cells in data["rows"]:
        assert "| " + " | ".join(cells) + " |" in printed
    for t in data["targets"]:
        assert f"| {t['what']} |" in printed
    assert f"capacity {capacity:.2f} completions/s" in printed
    backlog = rows[ROWS.index("backlog")]
    assert f"best-effort {backlog.be_share:.3f} of tokens" in printed
    assert sla.cpu_model() in printed


def _p(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q * 100, method="inverted_cdf"))


def _tpot(calls: list[Call], q: float) -> float:
    """Seconds between tokens, percentile ``q`` over the calls that had two or more."""
    return _p([(c.last - c.first) / (c.output_tokens - 1) for c in calls
               if c.first is not None and c.last is not None and c.output_tokens > 1], q)


def test_rows_option_takes_known_row_names() -> None:
    assert sla.parse_args(["--rows", "heavy,light"]).rows == ("heavy", "light")
    assert sla.parse_args([]).rows == ROWS
    with pytest.raises(SystemExit):
        sla.parse_args(["--rows", "light,nope"])


def test_the_small_seat_row_runs_when_asked_for_and_only_then() -> None:
    assert sla.parse_args(["--small-seats", "16"]).rows == (*ROWS, "overload32")
    named = sla.parse_args(["--rows", "alone,overload32"])  # implies 32 seats
    assert named.rows == ("alone", "overload32") and named.small_seats == 32
    assert sla.parse_args(["--rows", "overload32", "--small-seats", "16"]).small_seats == 16
    assert sla.parse_args(["--rows", "alone", "--small-seats", "16"]).rows == ("alone",)


def _ttft99(calls: list[Call]) -> float:
    return _p([(c.first - c.sent) * 1000 for c in calls if c.first is not None], 0.99)


def _goodput(row: Row) -> float:
    # every echo call finishes inside the window's aftermath: sum what each got in it
    total = 0.0
    for c in row.run.of("batch", "best-effort"):
        if c.first is not None and c.last is not None and c.last > c.first:
            inside = min(c.last, row.run.end) - max(c.first, row.run.start)
            total += c.output_tokens * max(0.0, inside) / (c.last - c.first)
    return total / (row.run.end - row.run.start)


def test_ratios_are_computed_from_the_rows(quick_run: tuple[list[Row], float]) -> None:
    rows, _ = quick_run
    by = {r.name: r for r in rows}
    for r in rows:  # no probe call was cut short: every TTFT is a measured one
        assert all(c.first is not None for c in r.run.of("interactive", "light"))
    got = {t.what: t.value for t in targets(by, 0.1)}
    inter = {n: by[n].run.of("interactive") for n in ("alone", "overload", "fcfs", "overload32")}
    tpot = {n: _tpot(calls, 0.5) for n, calls in inter.items()}
    light = {n: by[n].run.of("light") for n in ("light", "heavy")}
    growth = 2 * max(0.0, _tpot(light["heavy"], 0.99) - _tpot(light["light"], 0.5)) * 1000
    be = by["backlog"]
    share = be.run.window_tokens("best-effort") / be.run.window_tokens(
        "interactive", "batch", "best-effort")
    want = {
        "int. TTFT p99 overload / alone": _ttft99(inter["overload"]) / _ttft99(inter["alone"]),
        "int. TPOT p50 overload / alone": tpot["overload"] / tpot["alone"],
        "int. TTFT p99 overload (--max-num-seqs row) / alone":
            _ttft99(inter["overload32"]) / _ttft99(inter["alone"]),
        "int. TPOT p50 overload (--max-num-seqs row) / alone": tpot["overload32"] / tpot["alone"],
        "int. TTFT p99 overload / FCFS": _ttft99(inter["overload"]) / _ttft99(inter["fcfs"]),
        "bulk goodput overload / FCFS": _goodput(by["overload"]) / _goodput(by["fcfs"]),
        "light TTFT p99 with 10x heavy / alone":
            _ttft99(light["heavy"]) / _ttft99(light["light"]),
        "light TTFT p99 with heavy / (alone + 2 x step growth)":
            _ttft99(light["heavy"]) / (_ttft99(light["light"]) + growth),
        "BE share / WRR share, all backlogged": share / 0.1,
        "5xx, all rows": 0.0, "KV blocks used after drain, max": 0.0,
        "queue entries left, max": 0.0,
    }
    reach = _law_reach(by)
    if reach is not None:  # the echo server's step budget had warmed up
        want["bulk goodput overload / law's reach at the budget's 1.2x"] = (
            _goodput(by["overload"]) / reach)
    assert got.keys() == want.keys()
    for what, value in want.items():
        assert math.isclose(got[what], value, rel_tol=1e-9), what


def test_the_law_reach_target_prices_with_the_published_terms(
        quick_run: tuple[list[Row], float]) -> None:
    # the echo engine's own law prices nothing (no reach, no target row): a law in its place,
    # scaled to the run's alone TPOT so that bulk has room beside interactive
    rows, _ = quick_run
    by = {r.name: r for r in rows}
    step = 1.2 * _tpot(by["alone"].run.of("interactive"), 0.5)
    law = {"base_s": 0.1 * step, "per_row_s": 0.01 * step, "per_token_s": 0.002 * step,
           "per_kv_token_s": 1e-5 * step, "per_prefill_row_s": 0.005 * step,
           "kv_per_row": 40.0, "prefill_tokens": 8.0}
    by["overload"] = dataclasses.replace(by["overload"], law=law)
    reach = _law_reach(by)
    assert reach is not None and reach > 0
    got = {t.what: t.value for t in targets(by, 0.1)}
    assert math.isclose(got["bulk goodput overload / law's reach at the budget's 1.2x"],
                        _goodput(by["overload"]) / reach, rel_tol=1e-9)


def _law_reach(by: dict[str, Row]) -> float | None:
    """Bulk tokens/s the server's published law leaves beside interactive at 1.2x alone's
    TPOT p50 (the step budget's aim), straight from the law's terms: seconds a second's steps
    and requests take."""
    over = by["overload"]
    law = over.law
    if law is None:
        return None
    span = over.run.end - over.run.start

    def token_cost(chunk: float | None, *streams: str) -> tuple[float, float]:
        done = [c for c in over.run.of(*streams) if c.done]
        prompt = sum(c.prompt_tokens or 0 for c in done) / len(done)
        out = sum(c.output_tokens for c in done) / len(done)
        decode = law["per_row_s"] + law["per_token_s"] + law["per_kv_token_s"] * law["kv_per_row"]
        first, start = 0.0, 0.0
        while start < prompt:  # chunk by chunk, each reading the context up to its end
            n = min(chunk or prompt, prompt - start)
            first += (law["per_row_s"] + law["per_prefill_row_s"] + n * law["per_token_s"]
                      + (n + start) * law["per_kv_token_s"])
            start += n
        return ((out - 1) * decode + first) / out, over.run.window_tokens(*streams) / span

    step = 1.2 * _tpot(by["alone"].run.of("interactive"), 0.5)
    inter_cost, inter_rate = token_cost(None, "interactive")
    bulk_cost, _ = token_cost(law["prefill_tokens"] or None, "batch", "best-effort")
    if bulk_cost <= 0:  # a law that prices nothing (the echo engine's) reaches nothing
        return None
    return max(0.0, 1 - law["base_s"] / step - inter_rate * inter_cost) / bulk_cost


def test_tokens_in_conserves_a_calls_tokens() -> None:
    call = Call("t", "batch", 0.0, 40, first=1.0, last=5.0, events=37, tokens=40)
    cuts = [0.0, 1.7, 2.2, 3.9, 6.0]
    parts = [tokens_in(call, a, b) for a, b in itertools.pairwise(cuts)]
    assert math.isclose(sum(parts), 40)
    assert parts[1] / parts[2] == pytest.approx((2.2 - 1.7) / (3.9 - 2.2))
    cut_short = Call("t", "batch", 0.0, 40, first=1.0, last=2.0, events=9, cancelled=True)
    assert math.isclose(tokens_in(cut_short, 0, 10), 9)  # no usage chunk: one per event


def test_tokens_per_request_corrects_for_the_short_calls_finishing_first() -> None:
    prompts = Prompts(min_tokens=32, max_tokens=64)
    bodies = [prompts.body() for _ in range(40)]
    asked = [int(b["max_tokens"]) for b in bodies]  # type: ignore[call-overload]
    calls = [Call("c", "batch", 0.0, m, tokens=m * 3 // 4, done=m < 48) for m in asked]
    mean, finished = tokens_per_request(calls, prompts)
    assert finished == sum(m < 48 for m in asked)
    truth = sum(c.output_tokens for c in calls) / len(calls)  # all requests, not the finished
    naive = sum(c.output_tokens for c in calls if c.done) / finished
    assert mean == pytest.approx(truth, rel=0.05) and naive < 0.9 * truth
    assert tokens_per_request([], prompts) == (48.0, 0)


def test_parse_metrics_agrees_with_prometheus_client() -> None:
    text = ('# HELP carpool_kv_blocks x\n# TYPE carpool_kv_blocks gauge\n'
            'carpool_kv_blocks{state="used"} 12.0\ncarpool_kv_blocks{state="free"} 88.0\n'
            '# TYPE carpool_requests counter\ncarpool_requests_total{tier="batch",tenant="a",'
            'finish_reason="stop"} 3.0\ncarpool_requests_total{tier="interactive",tenant="b",'
            'finish_reason="length"} 4.0\n')
    ours = parse_metrics(text)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert (s.labels, s.value) in ours[s.name]
    assert metric_sum(ours, "carpool_kv_blocks", state="used") == 12.0
    assert metric_sum(ours, "carpool_requests_total") == 7.0


def test_restated_targets_are_computed_from_the_rows(quick_run: tuple[list[Row], float]) -> None:
    """Issue 39's targets recomputed here from the calls (and the steps from the server's
    own histogram, read through ``/metrics``): the law's growth, the worker's TPOT target."""
    rows, _ = quick_run
    by = {r.name: r for r in rows}
    got = {t.what: t.value for t in restated_targets(by, 0.1)}
    inter = {n: by[n].run.of("interactive") for n in ("alone", "overload", "overload32")}
    light = {n: by[n].run.of("light") for n in ("light", "heavy")}

    def growth(base: list[Call], loaded: list[Call]) -> float:
        return 2 * max(0.0, _tpot(loaded, 0.99) - _tpot(base, 0.5)) * 1000

    want: dict[str, float] = {}
    for name, label in (("overload", ""), ("overload32", " (--max-num-seqs row)")):
        row = by[name]
        held = [t for t in (row.tpot_target_s, by["alone"].tpot_target_s) if t]
        budget = min(held) * 1000 if held else 1.2 * _tpot(inter["alone"], 0.5) * 1000
        want[f"int. TTFT p99 overload{label} / (alone + 2 x step growth)"] = _ttft99(
            inter[name]) / (_ttft99(inter["alone"]) + growth(inter["alone"], inter[name]))
        want[f"int. TTFT p99 overload{label}, engine steps from the read"] = \
            row.budget["interactive"].steps_p99  # type: ignore[assignment]
        want[f"int. TPOT p50 overload{label} / its TPOT budget"] = (
            _tpot(inter[name], 0.5) * 1000 / budget)
    want["light TTFT p99 with heavy / (alone + 2 x step growth)"] = _ttft99(light["heavy"]) / (
        _ttft99(light["light"]) + growth(light["light"], light["heavy"]))
    be = by["backlog"]
    want["BE share / WRR share, all backlogged"] = be.run.window_tokens("best-effort") / (
        be.run.window_tokens("interactive", "batch", "best-effort") * 0.1)
    assert set(got) == {*want, "bulk goodput overload / law's reach within the TPOT budget"}
    for what, value in want.items():
        assert math.isclose(got[what], value, rel_tol=1e-9), what
    # the target is the one read while each row ran (the tier status, every second)
    assert all(by[n].tpot_target_s for n in ("alone", "overload", "overload32"))
    # the echo engine takes one step to a first token, or two when read mid-step
    for name in ("overload", "overload32"):
        assert 1 <= by[name].ttft_steps_p99() <= 2


def test_the_ttft_budget_is_in_the_report(quick_run: tuple[list[Row], float],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rows, capacity = quick_run
    sla.report(sla.parse_args(["--engine", "echo", "--quick"]), rows, capacity, 1.0)
    printed = capsys.readouterr().out
    for row in rows:
        if row.run.of("interactive"):  # every row interactive sends in has its budget line
            assert f"| {row.name} | interactive |" in printed
    for label in LABELS.values():
        assert f"{label} p50 / p99 ms" in printed
    assert "targets (restated on the law, issue 39)" in printed


def test_the_budget_sweep_prints_a_line_per_budget(quick_run: tuple[list[Row], float]) -> None:
    rows, _ = quick_run
    by = {r.name: r for r in rows}
    items = [SweepRow(x, by["overload"]) for x in (1.2, 1.6, 2.0)]
    lines = sweep_table(by["alone"], items, by["fcfs"]).splitlines()
    assert len(lines) == 2 + len(items)
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1.2", "1.6", "2"]
    assert sla.parse_args(["--tpot-budgets", "1.2,2"]).tpot_budgets == (1.2, 2.0)
    with pytest.raises(SystemExit):
        sla.parse_args(["--tpot-budgets", "0.5"])


def test_the_restated_bulk_target_is_against_the_reach_within_the_budget(
        quick_run: tuple[list[Row], float]) -> None:
    """With a law in place of the echo engine's: the reach at the budget (here the default
    1.2x alone, the worker's target left out), never above the FCFS row's bulk goodput."""
    rows, _ = quick_run
    by = {r.name: r for r in rows}
    step = 1.2 * _tpot(by["alone"].run.of("interactive"), 0.5)
    what = "bulk goodput overload / law's reach within the TPOT budget"
    for scale in (1.0, 0.01):  # a law that reaches less than FCFS, and one that reaches more
        law = {"base_s": 0.1 * step, "per_row_s": 0.01 * step * scale,
               "per_token_s": 0.002 * step * scale, "per_kv_token_s": 1e-5 * step * scale,
               "per_prefill_row_s": 0.005 * step * scale, "kv_per_row": 40.0,
               "prefill_tokens": 8.0}
        by["overload"] = dataclasses.replace(by["overload"], law=law, tpot_target_s=None)
        by["alone"] = dataclasses.replace(by["alone"], tpot_target_s=None)
        reach = _law_reach(by)
        assert reach is not None and reach > 0
        got = {t.what: t.value for t in restated_targets(by, 0.1)}
        want = _goodput(by["overload"]) / min(reach, _goodput(by["fcfs"]))
        assert math.isclose(got[what], want, rel_tol=1e-9), scale


def test_the_held_target_is_the_median_of_the_steady_samples() -> None:
    """The row's start (the demand window filling) and its grace are left out; with no
    sample in the steady part, every sample counts."""
    samples = [(0.0, 0.10), (5.0, 0.12), (11.0, 0.18), (15.0, 0.20), (20.0, 0.19),
               (30.0, 0.11)]
    assert held_target(samples, 10.0, 25.0) == 0.19  # the median of 0.18, 0.20, 0.19
    assert held_target(samples, 40.0, 50.0) == statistics.median(v for _, v in samples)
    assert held_target([], 0.0, 1.0) is None
