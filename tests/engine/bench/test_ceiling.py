"""engine.bench.ceiling on the tiny model: it runs exactly the model's linears (every layer's
four and the LM head) at the rows asked, and counts their FLOPs as a plain count from the
checkpoint's config does."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.bench.ceiling import linear_ceiling, linear_flops, linear_ops, linear_seconds
from engine.models.llama import LlamaForCausalLM
from engine.runner.loader import load_hf_config
from tests.engine.runner.helpers import make_runner


def _config_shapes(cfg: Any) -> list[tuple[int, int]]:
    """(in, out) of one forward's linears, from the HF config alone: q, k, v fused, gate and
    up fused, as the engine loads them; the LM head last."""
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = h // heads
    layer = [(h, (heads + 2 * kv) * hd), (heads * hd, h), (h, 2 * cfg.intermediate_size),
             (cfg.intermediate_size, h)]
    return layer * cfg.num_hidden_layers + [(h, cfg.vocab_size)]


def _record_calls(model: LlamaForCausalLM) -> list[tuple[str, int, int]]:
    """(module name, input rows, output width) of every linear forward and LM-head call."""
    calls: list[tuple[str, int, int]] = []
    for name, mod in model.named_modules():
        if name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            mod.register_forward_hook(
                lambda _m, inp, out, n=name: calls.append((n, inp[0].shape[0], out.shape[-1])))
    head = model.compute_logits

    def counted(x: torch.Tensor) -> torch.Tensor:
        out = head(x)
        calls.append(("lm_head", x.shape[0], out.shape[-1]))
        return out

    model.compute_logits = counted  # type: ignore[method-assign,assignment]
    return calls


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ops_are_the_model_linears_and_flops_a_plain_count(tiny_model_dir: Path,
                                                           dtype: str) -> None:
    model = make_runner(tiny_model_dir, dtype).model
    shapes = _config_shapes(load_hf_config(tiny_model_dir))
    ops = linear_ops(model)
    assert [(op.in_features, op.out_features) for op in ops] == shapes
    assert [op.is_head for op in ops] == [False] * (len(shapes) - 1) + [True]
    expected = sum(2.0 * (3 if i == len(shapes) - 1 else 7) * k * n
                   for i, (k, n) in enumerate(shapes))
    assert linear_flops(ops, tokens=7, head_rows=3) == expected
    _, flops = linear_seconds(model, 7, 3, repeats=1)
    assert flops == expected


def test_timing_pass_calls_each_linear_once_per_repeat_at_the_asked_rows(
        tiny_model_dir: Path) -> None:
    model = make_runner(tiny_model_dir, "float32").model
    calls = _record_calls(model)
    seconds, _ = linear_seconds(model, 5, 2, repeats=3)
    assert seconds > 0
    n_layers = len(model.layers)
    assert len(calls) == 3 * (4 * n_layers + 1)
    one_pass = calls[: 4 * n_layers + 1]
    assert [c[0] for c in one_pass[:4]] == ["layers.0.self_attn.qkv_proj", "layers.0.self_attn.o_proj",
                                            "layers.0.mlp.gate_up_proj", "layers.0.mlp.down_proj"]
    shapes = _config_shapes(load_hf_config(tiny_model_dir))
    assert [(rows, width) for _, rows, width in one_pass] == (
        [(5, n) for _, n in shapes[:-1]] + [(2, shapes[-1][1])])


def test_ceiling_times_each_distinct_step_once_and_skips_an_absent_head(
        tiny_model_dir: Path) -> None:
    model = make_runner(tiny_model_dir, "float32").model
    calls = _record_calls(model)
    # a prefill chunk that samples nothing (head rows 0) and two equal decode steps
    tok_s = linear_ceiling(model, [(6, 0), (2, 2), (2, 2)], useful_tokens=4, repeats=1)
    assert math.isfinite(tok_s) and tok_s > 0
    n_layers = len(model.layers)
    assert len(calls) == (4 * n_layers) + (4 * n_layers + 1)
    assert sorted({rows for name, rows, _ in calls if name != "lm_head"}) == [2, 6]
    assert [rows for name, rows, _ in calls if name == "lm_head"] == [2]
