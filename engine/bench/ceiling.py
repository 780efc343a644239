"""The linear-only ceiling of a run: what its steps would cost if they were only the model's
linear layers, run by the engine's own kernels on the model's own weights.

Contract: ``linear_ops(model, tokens)`` lists the loaded model's linears in forward order (each
layer's qkv, o, gate_up, down; then the LM head, for greedy rows, so on the screened head of
``kernels.greedy_head`` at a few rows, as the engine runs it) with their shapes;
``linear_seconds(model, tokens, head_rows)`` times one pass of all of them (best of
``repeats``) on random inputs of ``tokens`` rows (``head_rows`` for the LM head, which only
runs on the rows that sample) and returns the seconds and the FLOPs it did; ``linear_ceiling(model, steps, useful_tokens)`` sums
that over a run's steps, each at the batch sizes it really ran, and returns tokens/s.

Why this and not ``engine.bench.engine.matmul_ceiling`` (kept, printed beside it): that one
times ``torch.mm`` (aten/MKL) with one random (k, n) matrix per shape reused for all layers, so
the weights sit in cache, while a real step streams every layer's distinct weights (540 MB for
SmolLM2 fp32) and the engine's fp32 linears run oneDNN on packed weights
(``kernels.cpu_linear``), which is faster than aten at small M. That ceiling was both easier
than the engine's real work (cached weights) and slower than the engine's own linears; this
one is exactly the matmul work of the step the engine did, and nothing else (no attention,
norms, sampling or Python between the ops).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from engine.models import cpu_decode_step
from engine.models.llama import LlamaForCausalLM
from kernels import cpu_small_linear
from kernels.cpu_decode_layers import MAX_TOKENS
from kernels.cpu_int8_linear import Int8Linear
from kernels.cpu_linear import OneDNNLinear


@dataclass(frozen=True)
class LinearOp:
    name: str
    in_features: int
    out_features: int
    fn: Callable[[torch.Tensor], object]
    is_head: bool = False


def linear_ops(model: LlamaForCausalLM, tokens: int = 1) -> list[LinearOp]:
    """The model's linears in forward order: what one forward's matmuls are, at ``tokens``
    rows as the engine runs them (a step the whole-stack op takes runs its layers' linears on
    the small-batch op with the workers spinning between them, at any row count up to
    ``kernels.cpu_decode_layers.MAX_TOKENS``)."""
    in_stack = tokens <= MAX_TOKENS and cpu_decode_step.stack_for(model) is not None
    ops: list[LinearOp] = []
    for i, layer in enumerate(model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            # nn.Linear, OneDNNLinear or Int8Linear: all carry these two sizes
            mod: Any = layer.get_submodule(name)
            fn = _stack_linear(mod) if in_stack else mod
            ops.append(LinearOp(f"layers.{i}.{name}", mod.in_features, mod.out_features, fn))
    a = model.args
    # compute_logits: the packed head where routed, else F.linear on the (tied) weight; the
    # engine's greedy rows (every bench here is greedy) take the screened head where it applies
    ops.append(LinearOp("lm_head", a.hidden_size, a.vocab_size, lambda x: _head(model, x),
                        is_head=True))
    return ops


def _head(model: LlamaForCausalLM, x: torch.Tensor) -> object:
    """The head as a greedy step runs it (``ModelRunner._plain_greedy``): the screened tokens
    where the head decides them, else every logit."""
    tokens = model.greedy_tokens(x)
    return model.compute_logits(x) if tokens is None else tokens


def _stack_linear(mod: OneDNNLinear | Int8Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    small = mod.small
    assert small is not None  # stack_for binds only small-batch weights
    if isinstance(mod, Int8Linear):
        return lambda x: cpu_small_linear.linear_int8_on_pool(x, small, mod.scale, mod.bias,
                                                              mod.out_features, True)
    return lambda x: cpu_small_linear.linear_on_pool(x, small, mod.bias, mod.out_features, True)


def linear_flops(ops: Iterable[LinearOp], tokens: int, head_rows: int) -> float:
    return sum(2.0 * (head_rows if op.is_head else tokens) * op.in_features * op.out_features
               for op in ops)


def linear_seconds(
    model: LlamaForCausalLM, tokens: int, head_rows: int, repeats: int = 2
) -> tuple[float, float]:
    """Best time of one pass over every linear at these row counts, and its FLOPs."""
    ops = linear_ops(model, tokens)
    dtype = model.embed_tokens.weight.dtype
    rows = {op.name: head_rows if op.is_head else tokens for op in ops}
    # one input per op: activations are small and a step's sit in cache too
    inputs = {op.name: torch.randn(rows[op.name], op.in_features, dtype=dtype) for op in ops}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            for op in ops:
                if rows[op.name]:
                    op.fn(inputs[op.name])
            best = min(best, time.perf_counter() - t0)
    return best, linear_flops(ops, tokens, head_rows)


def linear_ceiling(
    model: LlamaForCausalLM, steps: Iterable[tuple[int, int]], useful_tokens: int, repeats: int = 2
) -> float:
    """Tokens/s if each step, a (matmul rows, LM-head rows) pair, cost only its linears."""
    total = sum(c * linear_seconds(model, t, h, repeats)[0] for (t, h), c in Counter(steps).items())
    return useful_tokens / total


def step_rows(out: Any) -> tuple[int, int]:
    """A step's (matmul rows, LM-head rows) from its ``SchedulerOutput``: every computed token
    and every padding row for the linears; the sampling rows and the padding for the head."""
    pad = out.num_padding_rows
    return out.num_batched_tokens + pad, sum(s.sample for s in out.scheduled) + pad


@dataclass(frozen=True)
class Interleaved:
    """A run's steps beside their own linears, timed one after the other (``interleaved``)."""

    steps: int
    step_s: float  # the engine's steps, summed (``LLMEngine.last_step_seconds``)
    linear_s: float  # each step's linears alone, timed right after it, summed

    @property
    def share(self) -> float:
        """The engine's time over its linears' alone: the share of the ceiling it reaches."""
        return self.linear_s / self.step_s


def interleaved(engine: Any, requests: Iterable[tuple[list[int], Any]]) -> Interleaved:
    """Run ``requests`` (prompt ids, sampling params) on ``engine`` to the end, timing after
    every step that step's linears alone (``linear_seconds``, best of two as in
    ``linear_ceiling``, at its matmul and head rows).

    Why: ``linear_ceiling`` times the linears after the run, and this machine's speed drifts
    by 10-20 % over minutes (the same step shapes' linears: 31.3 s then 35.5 s of a run's
    ceiling, one run apart), so the ratio of a run to a ceiling timed later mixes the two
    phases. Here each step and its linears share the same seconds. The linears' own time is
    outside the step's (the observer runs after ``last_step_seconds`` is taken)."""
    model = engine.runner.model
    step_s = linear_s = 0.0
    steps = 0

    def observe(out: Any, seconds: float) -> None:
        nonlocal step_s, linear_s, steps
        rows, heads = step_rows(out)
        step_s += seconds
        linear_s += linear_seconds(model, rows, heads)[0]  # best of two, as linear_ceiling
        steps += 1

    engine.step_observers.append(observe)
    try:
        for i, (prompt, params) in enumerate(requests):
            engine.add_request(prompt, params, request_id=f"interleaved-{i}")
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.step_observers.remove(observe)
    return Interleaved(steps, step_s, linear_s)
