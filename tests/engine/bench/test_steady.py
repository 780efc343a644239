"""Steady-state rows: counted until the waiting queue first empties, over whole admission
cycles. With 4 seats and equal requests of L tokens the queue empties when the third group is
admitted: the window is the two groups before it (8 L tokens in 2 L steps), in both modes; a
budget ends the window earlier with the queue still fed, at the last admission before it. The matmul rows per step (the step-cost factor's rows) are
counted step by step."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.bench.steady import run_steady, run_steady_together, steady_lines


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_window_ends_when_the_queue_first_empties(tiny_model_dir: Path, mode: str) -> None:
    length = 5
    prompts = [[5 + i, 6, 7] for i in range(12)]
    row = run_steady(mode, prompts, [length] * 12, str(tiny_model_dir), budget_s=600,
                     max_num_seqs=4, batching=mode)
    assert row.queue_emptied
    assert row.tokens == 8 * length
    assert row.steps == 2 * length
    # two prefill steps of 4 x 3 prompt tokens, the others 4 decode rows
    assert row.matmul_rows == 2 * 4 * 3 + (row.steps - 2) * 4


def test_budget_ends_the_window_with_the_queue_still_fed(tiny_model_dir: Path) -> None:
    prompts = [[5 + i, 6, 7] for i in range(12)]
    row = run_steady("c", prompts, [50] * 12, str(tiny_model_dir), budget_s=0.0,
                     max_num_seqs=4)
    assert not row.queue_emptied and row.steps == 1 and row.tokens == 4
    lines = steady_lines([row, row], 1.5)
    assert "= 1.00" in lines[-2] and "1.50" in lines[-2]
    assert "tokens/step ratio 1.00" in lines[-1] and "step-cost ratio (static ms / continuous ms) 1.00" in lines[-1]


def test_a_static_window_holds_whole_batches(tiny_model_dir: Path) -> None:
    # batches of 4 (lengths 2, 8, 2, 8): 8 steps a batch; every seat busy for the first 2 only
    lens = [2, 8] * 8
    prompts = [[5 + i, 6, 7] for i in range(16)]
    full = run_steady("s", prompts, lens, str(tiny_model_dir), budget_s=600, max_num_seqs=4,
                      batching="static")
    # the queue empties at the fourth batch's admission: three whole batches before it
    assert full.steps == 3 * 8 and full.tokens == 3 * (2 + 8 + 2 + 8)


def test_the_modes_step_in_turn_and_count_their_own_steps(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run together, the engines alternate step by step while both windows are open; each
    window is what the same mode gives alone (its tokens and steps), its seconds its own."""
    from engine.llm_engine import LLMEngine

    order: list[int] = []
    real = LLMEngine.step

    def step(self: LLMEngine) -> object:
        order.append(id(self))
        return real(self)

    prompts = [[5 + i, 6, 7] for i in range(16)]
    lens = [2, 8] * 8
    alone = [run_steady(mode, prompts, lens, str(tiny_model_dir), budget_s=600, max_num_seqs=4,
                        batching=mode) for mode in ("continuous", "static")]
    monkeypatch.setattr(LLMEngine, "step", step)
    both = run_steady_together([(m, {"max_num_seqs": 4, "batching": m})
                                for m in ("continuous", "static")],
                               prompts, lens, str(tiny_model_dir), budget_s=600)
    first, second = dict.fromkeys(order)
    warm = order.index(second)  # each engine's warm-up steps, one engine after the other
    assert order[:2 * warm] == [first] * warm + [second] * warm
    run = order[2 * warm:]
    shorter = min(run.count(first), run.count(second))
    assert run[:2 * shorter] == [first, second] * shorter  # in turn while both are open
    for got, want in zip(both, alone, strict=True):
        assert (got.tokens, got.steps, got.matmul_rows) == (want.tokens, want.steps,
                                                            want.matmul_rows)
        assert 0 < got.seconds
