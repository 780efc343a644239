"""The GPU benchmark: on a machine without CUDA it says so and exits 0."""

from __future__ import annotations

import pytest
import torch

from kernels.bench import gpu_kernels as bench


def test_without_cuda_prints_message_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert not torch.cuda.is_available()  # this suite runs on CPU machines
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out
    assert bench.main(["--batches", "1"]) == 0  # flags parse, still no CUDA


def test_bandwidth_row_math(capsys: pytest.CaptureFixture[str]) -> None:
    row = bench.Row("paged_attention", "x", "triton", ms=2.0, bytes_moved=4e9)
    assert row.gbps() == pytest.approx(2000.0)
    bench.print_rows([row], peak=4e12)
    assert "50.0%" in capsys.readouterr().out


def test_bad_flag_is_rejected() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--dtype", "int8"])


TINY = bench.ModelShape("tiny", num_heads=4, num_kv_heads=2, head_dim=16, hidden=32,
                        intermediate=48)


def _untimed(fn: object) -> float:
    assert callable(fn)
    fn()
    return 1.0


def test_bench_cases_run_and_agree_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU-only table code, run on CPU with the interpreter and timing stubbed out: every
    case builds, runs both implementations and reports a small error."""
    monkeypatch.setattr(bench, "time_ms", _untimed)
    cpu = torch.device("cpu")
    rows = bench.bench_attention(TINY, batch=2, ctx=40, dtype=torch.float32, dev=cpu)
    rows += bench.bench_pointwise(TINY, tokens=5, dtype=torch.float32, dev=cpu)
    assert [r.impl for r in rows[:3]] == ["triton", "torch ref", "SDPA gathered"]
    assert {r.op for r in rows} == {"paged_attention", "rms_norm", "fused_add_rms_norm",
                                    "rotary_embedding", "silu_and_mul", "write_kv_cache"}
    errors = [r.max_err for r in rows if r.max_err is not None]
    assert len(errors) == 7 and max(errors) < 1e-4
    assert all(r.bytes_moved > 0 for r in rows)
