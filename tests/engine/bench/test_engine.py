"""`carpool bench engine` pieces on a tiny model: rows count every matmul row they ran."""

from __future__ import annotations

import math
from pathlib import Path

from engine.bench.engine import Workload, matmul_ceiling, run_carpool
from engine.runner.loader import load_hf_config


def _workload() -> Workload:
    return Workload(prompts=[[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]], output_lens=[2, 5, 2, 5])


def test_continuous_row_steps_hold_exactly_the_fed_tokens(tiny_model_dir: Path) -> None:
    wl = _workload()
    row = run_carpool("c", wl, str(tiny_model_dir), max_num_seqs=4)
    fed = sum(len(p) for p in wl.prompts) + sum(n - 1 for n in wl.output_lens)
    assert sum(row.step_rows) == fed
    assert row.useful_tokens == sum(wl.output_lens)


def test_static_row_also_pays_for_its_idle_seats(tiny_model_dir: Path) -> None:
    wl = _workload()
    row = run_carpool("s", wl, str(tiny_model_dir), max_num_seqs=4, batching="static")
    fed = sum(len(p) for p in wl.prompts) + sum(n - 1 for n in wl.output_lens)
    # one batch of 4 seats: each 2-token request's seat idles for the 3 steps after it ends
    assert sum(row.step_rows) == fed + 2 * 3
    ceiling = matmul_ceiling(load_hf_config(tiny_model_dir), row, repeats=1)
    assert math.isfinite(ceiling) and ceiling > 0
