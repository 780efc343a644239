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


def test_cpu_tensors_use_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARPOOL_FORCE_TRITON", "1")  # read into EngineConfig, never here
    called = _spy_all(monkeypatch)
    assert not use_triton(torch.zeros(1))
    for call in _calls().values():
        call()
    assert called == []


def test_forcing_routes_every_op_to_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    called = _spy_all(monkeypatch)
    for op, call in _calls(triton=True).items():
        with pytest.raises(RuntimeError, match="triton path taken"):
            call()
        assert called[-1] == op
    assert len(called) == len(_calls())


def test_forcing_false_keeps_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    called = _spy_all(monkeypatch)
    assert not use_triton(torch.zeros(1), force=False)
    for call in _calls(triton=False).values():
        call()
    assert called == []


@pytest.mark.parametrize(("env", "given", "expected"), [
    (None, None, None), ("1", None, True), ("0", None, None), ("1", False, False),
    (None, True, True),
])
def test_the_env_switch_is_read_into_the_engine_config(
    env: str | None, given: bool | None, expected: bool | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CARPOOL_FORCE_TRITON=1 forces Triton only where the config leaves the choice open."""
    from engine.core.config import EngineConfig

    if env is None:
        monkeypatch.delenv("CARPOOL_FORCE_TRITON", raising=False)
    else:
        monkeypatch.setenv("CARPOOL_FORCE_TRITON", env)
    config = EngineConfig.from_kwargs(use_triton=given) if given is not None else EngineConfig()
    assert config.use_triton is expected

