"""``carpool bench gpu`` without CUDA says why and times nothing; its summary names each check."""

from __future__ import annotations

import pytest
import torch

from engine.bench import gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run")
def test_without_cuda_it_says_so_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu.main([]) == 0
    assert capsys.readouterr().out.strip() == gpu.NO_CUDA


def test_summary_reports_the_ratio() -> None:
    text = gpu._summary(2, 3, {"carpool": 300.0, "transformers": 120.0})
    assert "| 2/3 prompts |" in text and "| 2.50 |" in text
