"""The one dispatch point: CPU tensors -> references, forced -> Triton, for every op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kernels
from kernels.dispatch import use_triton
from tests.kernels.factories import make_paged_batch


def _calls(triton: bool | None = None) -> dict[str, Callable[[], Any]]:
    x = torch.randn(2, 32)
    w = torch.ones(32)
    q, k = torch.randn(2, 2, 16), torch.randn(2, 1, 16)
    cache = torch.zeros(2, 16, 1, 16)
    batch = make_paged_batch([1], [3], num_heads=2, num_kv_heads=1, head_dim=16)
    table = kernels.rope_cos_sin(16, 8, 10000.0)
    return {
        "rms_norm": lambda: kernels.rms_norm(x, w, 1e-6, triton=triton),
        "fused_add_rms_norm": lambda: kernels.fused_add_rms_norm(x, x, w, 1e-6, triton=triton),
        "rotary_embedding": lambda: kernels.rotary_embedding(
            torch.tensor([0, 1]), q, k, table, triton=triton),
        "silu_and_mul": lambda: kernels.silu_and_mul(x, triton=triton),
        "write_kv_cache": lambda: kernels.write_kv_cache(k, k, cache, cache.clone(),
                                                         torch.tensor([0, 1]), triton=triton),
        "paged_attention": lambda: kernels.paged_attention(*batch.args(), triton=triton),
    }


def _spy_all(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    called: list[str] = []
    for op in _calls():
        def spy(*args: Any, _op: str = op, **kwargs: Any) -> Any:
            called.append(_op)
            raise RuntimeError("triton path taken")
        monkeypatch.setattr(kernels, f"{op}_triton", spy)
    return called


@pytest.fixture(autouse=True)
def _automatic_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CARPOOL_FORCE_TRITON", raising=False)


def test_cpu_tensors_use_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    called = _spy_all(monkeypatch)
    assert not use_triton(torch.zeros(1))
    for call in _calls().values():
        call()
    assert called == []


@pytest.mark.parametrize("how", ["argument", "env"])
def test_forcing_routes_every_op_to_triton(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    called = _spy_all(monkeypatch)
    if how == "env":
        monkeypatch.setenv("CARPOOL_FORCE_TRITON", "1")
    for op, call in _calls(triton=True if how == "argument" else None).items():
        with pytest.raises(RuntimeError, match="triton path taken"):
            call()
        assert called[-1] == op
    assert len(called) == len(_calls())


def test_forcing_false_beats_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARPOOL_FORCE_TRITON", "1")
    called = _spy_all(monkeypatch)
    assert not use_triton(torch.zeros(1), force=False)
    for call in _calls(triton=False).values():
        call()
    assert called == []

