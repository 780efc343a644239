"""``carpool bench serve`` pieces: a quick run on the tiny model (a real ``carpool serve``
process, real HTTP streaming) whose rows hold every request of the workload, with the table's
figures recomputed here from the traces (numpy's nearest-rank percentile as the reference);
the workload's prompts are the chat template's ids; the streams rows' prompts are guidellm's 32
tokens. (The llama.cpp baseline: test_serve_llama.py; the targets: test_serve_compare.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gateway.bench import serve
from gateway.bench.serve_rows import Row, Trace, percentile, table
from gateway.bench.sla_client import ChatTarget


@pytest.fixture(scope="module")
def quick_rows(tiny_model_dir: Path) -> list[Row]:
    return serve.run(serve.parse_args(["--quick", "--model", str(tiny_model_dir),
                                       "--streams", "2"]))


def test_quick_run_has_both_rows_with_every_request(quick_rows: list[Row]) -> None:
    offline, served, _ = quick_rows
    assert offline.name.startswith("Carpool offline") and served.name.startswith("Carpool serve")
    assert (offline.server, served.server, served.streams) == ("Carpool offline", "Carpool fp32", 0)
    wl = serve.make_workload(8, 4, 16)
    for row in (offline, served):
        assert sorted(t.asked for t in row.traces) == sorted(wl.output_lens)
        assert all(not t.error for t in row.traces)
        assert all(len(t.times) >= 1 and t.tokens >= 1 for t in row.traces)
        assert row.wall_s > 0
    # the engine honours ignore_eos: offline, every request gets exactly what it asked for
    assert [t.tokens for t in offline.traces] == [t.asked for t in offline.traces]
    assert offline.short_ended == 0
    assert served.note.startswith("CPU during the served row")


def test_table_figures_are_the_traces(quick_rows: list[Row]) -> None:
    offline, served, _ = quick_rows
    text = table(quick_rows, offline)
    for row in quick_rows:
        tokens = sum(t.tokens for t in row.traces)
        assert f"| {tokens / row.wall_s:.1f} |" in text
        ttfts = [t.times[0] - t.sent for t in row.traces if t.times]
        ref = float(np.percentile(ttfts, 50, method="inverted_cdf"))
        assert f"| {ref:.2f} |" in text
    assert math.isclose(served.tok_s / offline.tok_s,
                        float(text.splitlines()[3].split("|")[5]), abs_tol=0.006)


@pytest.mark.parametrize("values", [[3.0], [5.0, 1.0], [float(i % 7) for i in range(101)]])
def test_percentile_is_nearest_rank(values: list[float]) -> None:
    for q in (1, 50, 90, 99, 100):
        assert percentile(values, q) == float(np.percentile(values, q, method="inverted_cdf"))
    assert math.isnan(percentile([], 50))


def test_trace_gaps_and_latency() -> None:
    t = Trace(sent=1.0, asked=3, times=[1.5, 1.7, 2.2], tokens=3)
    assert t.ttft == 0.5 and t.latency == pytest.approx(1.2)
    assert t.gaps() == pytest.approx([0.2, 0.5])
    assert Row("r", 1.0, [t, Trace(0.0, 5, [1.0], 1)]).short_ended == 1


def test_chat_ids_are_the_gateways(tiny_model_dir: Path) -> None:
    from engine.runner.loader import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    msgs = serve.make_workload(3, 1, 2).messages[2]
    ref = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ref = ref["input_ids"] if not isinstance(ref, list) else ref  # transformers 5: a mapping
    assert serve.chat_ids(tok, msgs) == list(ref)


def test_streams_row_counts_only_the_window(quick_rows: list[Row]) -> None:
    row = quick_rows[2]
    assert row.name == "Carpool fp32, 2 streams x 2 s" and row.wall_s == pytest.approx(2.0, abs=0.1)
    assert (row.server, row.streams) == ("Carpool fp32", 2)
    assert row.traces and all(not t.error for t in row.traces)
    last = max(t.sent for t in row.traces)
    assert all(tm <= last + 2.0 + 60 for t in row.traces for tm in t.times)
    # every request but those the window's end cut got its 64 tokens
    assert all(t.tokens == t.asked for t in row.traces), [(t.tokens, t.asked) for t in row.traces]
    assert sum(t.tokens == 64 for t in row.traces) >= len(row.traces) - 2


def test_streams_prompts_are_32_tokens(tiny_model_dir: Path) -> None:
    from engine.runner.loader import load_tokenizer
    from gateway.bench.serve_streams import PROMPT, TOPICS

    tok = load_tokenizer(tiny_model_dir)  # SmolLM2's tokenizer
    assert [len(tok.encode(PROMPT.format(topic=t), add_special_tokens=False)) for t in TOPICS] \
        == [32] * len(TOPICS)


def test_the_sweep_runs_each_level_on_every_server_back_to_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Level by level, the kept servers in turn, the order reversed at every other level, so a
    level's rows are seconds apart whatever server they ran on."""
    ran: list[tuple[str, int]] = []

    async def fake_row(server: str, target: ChatTarget, key: str, tier: str, n: int,
                       seconds: float) -> Row:
        ran.append((server, n))
        return Row(f"{server}, {n} streams", seconds, [], server=server, streams=n)

    monkeypatch.setattr(serve, "streams_row", fake_row)
    args = serve.parse_args(["--quick", "--streams", "1", "8", "32"])
    targets = [serve.SweepTarget(name, ChatTarget("127.0.0.1", 1, "m"), "k")
               for name in ("A", "B", "C")]
    rows = serve.sweep_rows(targets, args)
    assert ran == [("A", 1), ("B", 1), ("C", 1), ("C", 8), ("B", 8), ("A", 8),
                   ("A", 32), ("B", 32), ("C", 32)]
    assert [(r.server, r.streams) for r in rows] == ran

