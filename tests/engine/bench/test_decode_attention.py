"""`carpool bench engine --decode-kernels`: runs on CPU with a tiny model (the interpreter
takes the Triton path), and says it needs CUDA from the command."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernels
from engine.bench import decode_attention
from engine.bench.engine import main


def test_engine_decode_hook_runs_on_cpu(tiny_model_dir: Path) -> None:
    tput = decode_attention.bench_engine_decode(str(tiny_model_dir), batch=2, prompt_len=6,
                                                max_tokens=3, dtype="float32", device="cpu")
    assert set(tput) == {"triton", "torch ref"} and all(v > 0 for v in tput.values())
    assert not kernels.use_triton(torch.zeros(1))  # no process-wide switch was left behind


def test_the_option_without_cuda_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert not torch.cuda.is_available()  # this suite runs on CPU machines
    assert main(["--decode-kernels"]) == 0
    assert "no CUDA device" in capsys.readouterr().out
