"""StepPlan: the decode fast path schedules exactly what the general ``add`` does."""

from __future__ import annotations

import pytest

from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.core.step_plan import StepPlan


def decode_ready(outputs: int, params: SamplingParams) -> Request:
    """A request whose every known token but the last is computed (a decode row)."""
    req = Request("r", [5, 6, 7, 8, 9], params, arrival_time=0.0)
    req.output_token_ids.extend(range(100, 100 + outputs))
    req.num_computed_tokens = req.num_tokens - 1
    req.eos_token_id = 2
    return req


@pytest.mark.parametrize("outputs", [0, 1, 7])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(repetition_penalty=1.3)],
                         ids=["plain", "penalties"])
def test_add_decode_is_add_of_one_token(outputs: int, params: SamplingParams) -> None:
    table = [3, 1, 4]
    general, fast = StepPlan(budget=10), StepPlan(budget=10)
    general.add(decode_ready(outputs, params), 1, table)
    fast.add_decode(decode_ready(outputs, params), table)
    assert fast.scheduled == general.scheduled and fast.budget == general.budget == 9
    (row,) = fast.scheduled.values()
    assert row.token_ids == [99 + outputs if outputs else 9] and row.sample
    assert (row.history is not None) is (params.repetition_penalty != 1.0)
    table.append(5)  # the block table grows after the step: the row kept its own copy
    assert row.block_ids == [3, 1, 4]
