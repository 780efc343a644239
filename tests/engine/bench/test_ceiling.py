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
from engine.models import cpu_decode_step
from engine.models.llama import LlamaForCausalLM
from engine.runner.loader import load_hf_config
from kernels import cpu_small_linear
from kernels.cpu_decode_layers import MAX_TOKENS
from tests.engine.runner.helpers import make_runner


def _config_shapes(cfg: Any) -> list[tuple[int, int]]:
    """(in, out) of one forward's linears, from the HF config alone: q, k, v fused, gate and
    up fused, as the engine loads them; the LM head last."""
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = h // heads
    layer = [(h, (heads + 2 * kv) * hd), (heads * hd, h), (h, 2 * cfg.intermediate_size),
             (cfg.intermediate_size, h)]
    return layer * cfg.num_hidden_layers + [(h, cfg.vocab_size)]


def _record_calls(model: LlamaForCausalLM,
                  monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(module name, input rows, output width) of every linear forward and LM-head call (the
    full head or the greedy screen, whichever decided), and of every call of the small-batch
    op as the whole-stack op runs it (named by its packed weight)."""
    calls: list[tuple[str, int, int]] = []
    by_weight: dict[int, str] = {}
    for name, mod in model.named_modules():
        if name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            mod.register_forward_hook(
                lambda _m, inp, out, n=name: calls.append((n, inp[0].shape[0], out.shape[-1])))
            by_weight[id(getattr(mod, "small", None))] = name
    on_pool = cpu_small_linear.linear_on_pool

    def pooled(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int,
               spin: bool) -> torch.Tensor:
        calls.append((by_weight[id(packed)], x.shape[0], n))
        return on_pool(x, packed, bias, n, spin)

    monkeypatch.setattr(cpu_small_linear, "linear_on_pool", pooled)
    head = model.compute_logits

    def counted(x: torch.Tensor) -> torch.Tensor:
        out = head(x)
        calls.append(("lm_head", x.shape[0], out.shape[-1]))
        return out

    model.compute_logits = counted  # type: ignore[method-assign,assignment]
    greedy = model.greedy_tokens

    def screened(x: torch.Tensor) -> list[int] | None:
        tokens = greedy(x)
        if tokens is not None:  # the screened head decided: the head ran, at these rows
            calls.append(("lm_head", x.shape[0], model.args.vocab_size))
        return tokens

    model.greedy_tokens = screened  # type: ignore[method-assign]
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


@pytest.mark.parametrize("tokens", [5, MAX_TOKENS + 1], ids=["in the stack", "past it"])
def test_timing_pass_calls_each_linear_once_per_repeat_at_the_asked_rows(
        tiny_model_dir: Path, tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_runner(tiny_model_dir, "float32").model
    calls = _record_calls(model, monkeypatch)
    pooled: list[int] = []
    original = cpu_small_linear.linear_on_pool
    monkeypatch.setattr(cpu_small_linear, "linear_on_pool",
                        lambda *a: pooled.append(1) or original(*a))
    seconds, _ = linear_seconds(model, tokens, 2, repeats=3)
    assert seconds > 0
    # a step the whole-stack op takes times its linears as the stack runs them
    stack = cpu_decode_step.stack_for(model) is not None and tokens <= MAX_TOKENS
    assert len(pooled) == (3 * 4 * len(model.layers) if stack else 0)
    n_layers = len(model.layers)
    assert len(calls) == 3 * (4 * n_layers + 1)
    one_pass = calls[: 4 * n_layers + 1]
    assert [c[0] for c in one_pass[:4]] == ["layers.0.self_attn.qkv_proj", "layers.0.self_attn.o_proj",
                                            "layers.0.mlp.gate_up_proj", "layers.0.mlp.down_proj"]
    shapes = _config_shapes(load_hf_config(tiny_model_dir))
    assert [(rows, width) for _, rows, width in one_pass] == (
        [(tokens, n) for _, n in shapes[:-1]] + [(2, shapes[-1][1])])


def test_ceiling_times_each_distinct_step_once_and_skips_an_absent_head(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_runner(tiny_model_dir, "float32").model
    calls = _record_calls(model, monkeypatch)
    # a prefill chunk that samples nothing (head rows 0) and two equal decode steps
    tok_s = linear_ceiling(model, [(6, 0), (2, 2), (2, 2)], useful_tokens=4, repeats=1)
    assert math.isfinite(tok_s) and tok_s > 0
    n_layers = len(model.layers)
    assert len(calls) == (4 * n_layers) + (4 * n_layers + 1)
    assert sorted({rows for name, rows, _ in calls if name != "lm_head"}) == [2, 6]
    assert [rows for name, rows, _ in calls if name == "lm_head"] == [2]


def test_interleaved_times_each_steps_own_linears_right_after_it(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of the run gets one linear pass at its own matmul and head rows (a prompt
    step's prompt tokens, a decode step's rows), and the sums are of those figures."""
    from engine.bench import ceiling
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32")
    steps: list[tuple[int, int, float]] = []
    engine.step_observers.append(lambda out, s: steps.append(
        (out.num_batched_tokens + out.num_padding_rows,
         sum(x.sample for x in out.scheduled) + out.num_padding_rows, s)))
    passes: list[tuple[int, int]] = []

    def fake(model: Any, tokens: int, head_rows: int, repeats: int = 2) -> tuple[float, float]:
        assert model is engine.runner.model and repeats == 2
        passes.append((tokens, head_rows))
        return 0.001 * tokens, 0.0

    monkeypatch.setattr(ceiling, "linear_seconds", fake)
    prompts = [list(range(3, 3 + n)) for n in (5, 9, 2)]
    got = ceiling.interleaved(engine, [(p, SamplingParams(max_tokens=4, ignore_eos=True))
                                       for p in prompts])
    assert passes == [(t, h) for t, h, _ in steps] and got.steps == len(steps)
    assert passes[0] == (5 + 9 + 2, 3)  # the prompt step: every prompt token, three heads
    assert got.step_s == pytest.approx(sum(s for *_, s in steps))
    assert got.linear_s == pytest.approx(0.001 * sum(t for t, _, _ in steps))
    assert got.share == pytest.approx(got.linear_s / got.step_s)
    assert not engine.has_unfinished_requests() and len(engine.step_observers) == 1
