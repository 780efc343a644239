"""kernels.cpu_linear: oneDNN's packed fp32 linear against F.linear (to fp32 rounding), and
where the engine must keep F.linear (float64, no oneDNN)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu_linear
from kernels.cpu_linear import OneDNNLinear, PackedHead
from tests.engine.runner.helpers import make_runner

needs_onednn = pytest.mark.skipif(
    not cpu_linear.available(torch.empty(1)), reason="torch built without oneDNN"
)


@needs_onednn
@pytest.mark.parametrize("m", [1, 3, 8, 37, 130])  # decode rows, odd sizes, a prefill M
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(m: int, bias: bool) -> None:
    torch.manual_seed(m)
    lin = nn.Linear(576, 1000, bias=bias)
    x = torch.randn(m, 576)
    got = OneDNNLinear(lin)(x)
    ref = F.linear(x.double(), lin.weight.double(), None if lin.bias is None else lin.bias.double())
    assert got.shape == (m, 1000) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_input_major_weight_view_and_tied_head_pack_the_same_values() -> None:
    """The model stores weights as transposed views (llama.use_input_major_linear_weights)."""
    torch.manual_seed(0)
    w = torch.randn(300, 64).t().contiguous().t()
    x = torch.randn(5, 64)
    got = PackedHead.of(w)(x)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-4, atol=1e-4)


def test_float64_model_keeps_f_linear(tiny_model_dir: Path) -> None:
    runner = make_runner(tiny_model_dir, "float64")
    model = runner.model
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules())
    assert model.logits_linear is None
    assert cpu_linear.route_cpu_linears(model) == 0


@needs_onednn
def test_float32_model_routes_every_linear_and_matches_float64(tiny_model_dir: Path) -> None:
    model = make_runner(tiny_model_dir, "float32").model
    ref = make_runner(tiny_model_dir, "float64").model  # unrouted: F.linear in float64
    expected = 4 * len(model.layers) + (model.lm_head is not None)
    assert sum(isinstance(m, OneDNNLinear) for m in model.modules()) == expected
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.logits_linear is not None
    hidden = torch.randn(7, model.args.hidden_size)
    torch.testing.assert_close(
        model.compute_logits(hidden).double(), ref.compute_logits(hidden.double()),
        rtol=1e-4, atol=1e-4,
    )
    mlp = model.layers[0].mlp
    x = torch.randn(4, model.args.hidden_size)
    torch.testing.assert_close(
        mlp(x).double(), ref.layers[0].mlp(x.double()), rtol=1e-4, atol=1e-4
    )


def test_no_onednn_keeps_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = nn.Sequential(nn.Linear(8, 8))
    assert cpu_linear.route_cpu_linears(model) == 0
    assert type(model[0]) is nn.Linear
