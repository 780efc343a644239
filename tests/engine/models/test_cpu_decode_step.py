"""engine.models.cpu_decode_step: a pure decode step on CPU fp32 takes the whole-stack op
(kernels.cpu_decode_layers) or, without it, the direct-op path; both give the same bits as the
general path (the same ops in the same order), and logits close to transformers' float64
model. Prompt steps take the direct paths too (their tokens attend as decode rows: SDPA's
numbers up to rounding) until their reads pass MAX_PROMPT_READS; float64 keeps the general
path."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.models import cpu_decode_step
from kernels import cpu_decode, cpu_decode_layers, cpu_layer_ops, cpu_small_linear
from tests.engine.runner.helpers import (
    BlockTables,
    chunk,
    hf_logits,
    hf_model,
    make_runner,
    step_logits,
)
from tests.model_factories import make_tiny_llama_dir

pytestmark = pytest.mark.skipif(not (cpu_layer_ops.available() and cpu_decode.available()),
                                reason="CPU ops not built (make setup)")


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    # q/k/v biases and GQA 4:1
    return make_tiny_llama_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2", seed=2, heads=4,
                               kv_heads=1, tokenizer_dir=smollm2_dir)


def _run(model_dir: Path, dtype: str, mode: str, monkeypatch: pytest.MonkeyPatch,
         taken: list[str]) -> list[list[torch.Tensor]]:
    """Prefill three requests in one step (14 prompt tokens), then five decode steps; logits of
    every step. mode: "stack" (as served), "ops" (the whole-stack op off), "decode-only" (as
    served, but the prompt step on the general path) or "general" (no direct path);
    ``taken`` gets "stack" per whole-stack call and "layer" per direct-op layer."""
    runner = make_runner(model_dir, dtype)
    rng = random.Random(4)
    seqs = {rid: [rng.randrange(3, 49152) for _ in range(n)] for rid, n in
            (("a", 9), ("b", 6), ("c", 14))}
    blocks = BlockTables(runner.num_blocks, runner.block_size, seed=5)
    out = []
    with monkeypatch.context() as m:
        real_layer = cpu_decode_step.layer_forward
        real_stack = cpu_decode_layers.DecodeLayers.forward
        real_prepare = cpu_decode_step.prepare

        def layer(*args: object) -> object:
            taken.append("layer")
            return real_layer(*args)  # type: ignore[arg-type]

        def stack(*args: object) -> object:
            taken.append("stack")
            return real_stack(*args)  # type: ignore[arg-type]

        def decode_only(model: object, ids: torch.Tensor, *rest: object) -> object:
            meta = rest[-1]
            if ids.shape[0] != meta.seq_lens.shape[0]:  # type: ignore[attr-defined]
                return None
            return real_prepare(model, ids, *rest)  # type: ignore[arg-type]

        m.setattr(cpu_decode_step, "layer_forward", layer)
        m.setattr(cpu_decode_layers.DecodeLayers, "forward", stack)
        if mode == "ops":
            m.setattr(cpu_decode_step, "stack_for", lambda model: None)
        if mode == "decode-only":
            m.setattr(cpu_decode_step, "prepare", decode_only)
        if mode == "general":
            m.setattr(cpu_decode_step, "prepare", lambda *args: None)
        done = {rid: 0 for rid in seqs}
        for step in range(6):
            scheduled = []
            for rid, seq in seqs.items():
                n = len(seq) - 5 if step == 0 else 1
                scheduled.append(chunk(rid, seq[done[rid]:done[rid] + n], done[rid], blocks))
                done[rid] += n
            out.append(step_logits(runner, scheduled))
    return out


def _equal(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return all(torch.equal(x, y) for sa, sb in zip(a, b, strict=True)
               for x, y in zip(sa, sb, strict=True))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_steps_same_bits_as_general_path(
    arch: str, tiny_model_dir: Path, qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tiny_model_dir if arch == "llama" else qwen2_dir
    general = _run(model_dir, "float32", "general", monkeypatch, [])
    taken: list[str] = []
    decode_only = _run(model_dir, "float32", "decode-only", monkeypatch, taken)
    # every decode step, never the prompt step
    layers = len(make_runner(model_dir, "float32").model.layers)
    assert taken == (["stack"] * 5 if cpu_decode_layers.available() else ["layer"] * 5 * layers)
    assert _equal(decode_only, general)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompt_step_takes_the_direct_path_stack_and_ops_alike(
    arch: str, tiny_model_dir: Path, qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tiny_model_dir if arch == "llama" else qwen2_dir
    layers = len(make_runner(model_dir, "float32").model.layers)
    taken: list[str] = []
    ops = _run(model_dir, "float32", "ops", monkeypatch, taken)
    assert taken == ["layer"] * 6 * layers  # the 14-token prompt step too
    if cpu_decode_layers.available():
        taken.clear()
        stacked = _run(model_dir, "float32", "stack", monkeypatch, taken)
        assert taken == ["stack"] * 6
        assert _equal(stacked, ops)
    # prompt tokens attend as decode rows: SDPA's numbers up to rounding, not its bits
    general = _run(model_dir, "float32", "general", monkeypatch, [])
    for got, want in zip(ops, general, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)


def test_the_stack_op_is_built_wherever_its_three_ops_are() -> None:
    # make setup builds all four; a build error in the combined source would only print
    # "not built", skip the stack's tests and leave the server on the per-op path
    if cpu_small_linear.available():
        assert cpu_decode_layers.available()


@pytest.mark.parametrize("with_stack", [True, False])
def test_a_prompt_step_goes_direct_until_its_reads_pass_the_limit(
        tiny_model_dir: Path, with_stack: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt step goes direct: the stack up to its MAX_TOKENS, past it the direct ops while
    its prompt tokens' contexts sum to at most MAX_PROMPT_READS, and SDPA's general path past
    that. Here the limit is lowered to a 60-token prompt's reads (1 + ... + 60)."""
    runner = make_runner(tiny_model_dir, "float32")
    blocks = BlockTables(runner.num_blocks, runner.block_size, seed=1)
    if not with_stack:
        monkeypatch.setattr(cpu_decode_step, "stack_for", lambda model: None)
    elif not cpu_decode_layers.available():
        pytest.skip("whole-stack op not built")
    monkeypatch.setattr(cpu_decode_step, "MAX_PROMPT_READS", 60 * 61 // 2)
    monkeypatch.setattr(cpu_decode_layers, "MAX_TOKENS", 40)
    for n, direct, stacked in ((40, True, with_stack), (41, True, False), (60, True, False),
                               (61, False, False)):
        step = runner.prepare_inputs([chunk(f"r{n}", list(range(3, 3 + n)), 0, blocks)])
        fast = cpu_decode_step.prepare(runner.model, step.input_ids, step.positions,
                                       runner.kv_caches, step.meta)
        assert (fast is not None) == direct, n
        assert fast is None or (fast.stack is not None) == stacked, n
        if fast is not None:  # each prompt token reads its own context: causal
            assert fast.seq_lens.tolist() == list(range(1, n + 1))
    # a decode row's context is not a prompt read: beside it a 60-token prompt still goes direct
    step = runner.prepare_inputs([chunk("r41", [7], 20, blocks),  # tables made above
                                  chunk("r60", list(range(3, 63)), 0, blocks)])
    fast = cpu_decode_step.prepare(runner.model, step.input_ids, step.positions,
                                   runner.kv_caches, step.meta)
    assert fast is not None and fast.seq_lens.tolist() == [21, *range(1, 61)]
    if with_stack:  # within the stack's tokens the limit does not apply
        monkeypatch.setattr(cpu_decode_step, "MAX_PROMPT_READS", 10)
        step = runner.prepare_inputs([chunk("r40", list(range(3, 43)), 0, blocks)])
        fast = cpu_decode_step.prepare(runner.model, step.input_ids, step.positions,
                                       runner.kv_caches, step.meta)
        assert fast is not None and fast.stack is not None


def test_direct_path_close_to_transformers(tiny_model_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runner_logits = _run(tiny_model_dir, "float32", "stack", monkeypatch, [])
    ref = hf_model(tiny_model_dir)
    rng = random.Random(4)
    seqs = [[rng.randrange(3, 49152) for _ in range(n)] for n in (9, 6, 14)]
    for i, seq in enumerate(seqs):
        want = hf_logits(ref, seq)
        # the prompt step computes positions 0 .. len - 6, decode step s position len - 6 + s
        torch.testing.assert_close(runner_logits[0][i].double(), want[:len(seq) - 5],
                                   atol=1e-4, rtol=0)
        for step in range(1, 6):
            got = runner_logits[step][i]
            torch.testing.assert_close(got.double(), want[len(seq) - 6 + step:len(seq) - 5 + step],
                                       atol=1e-4, rtol=0)


def test_float64_keeps_the_general_path(tiny_model_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    _run(tiny_model_dir, "float64", "stack", monkeypatch, taken)
    assert taken == []


def test_a_prompt_step_past_the_stack_is_close_to_the_general_path(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """120 prompt tokens in three requests (past the stack's MAX_TOKENS): the direct ops with
    every prompt token attending as a decode row, against SDPA's general path (rounding apart),
    and then a decode step on each path's KV."""
    rng = random.Random(7)
    seqs = {rid: [rng.randrange(3, 49152) for _ in range(n)] for rid, n in
            (("a", 50), ("b", 40), ("c", 31))}
    assert sum(len(s) - 1 for s in seqs.values()) > cpu_decode_layers.MAX_TOKENS

    taken: list[str] = []
    real_layer = cpu_decode_step.layer_forward

    def layer(*args: object) -> object:
        taken.append("layer")
        return real_layer(*args)  # type: ignore[arg-type]

    def run(general: bool) -> list[list[torch.Tensor]]:
        runner = make_runner(tiny_model_dir, "float32")
        blocks = BlockTables(runner.num_blocks, runner.block_size, seed=3)
        with monkeypatch.context() as m:
            m.setattr(cpu_decode_step, "layer_forward", layer)
            if general:
                m.setattr(cpu_decode_step, "prepare", lambda *args: None)
            prompt = step_logits(runner, [chunk(rid, s[:-1], 0, blocks)
                                          for rid, s in seqs.items()])
            decode = step_logits(runner, [chunk(rid, s[-1:], len(s) - 1, blocks)
                                          for rid, s in seqs.items()])
        return [prompt, decode]

    direct = run(False)
    layers = len(make_runner(tiny_model_dir, "float32").model.layers)
    # the prompt step on the direct ops, layer by layer (past the stack); the decode step on
    # the stack where it is built
    assert taken == ["layer"] * layers * (1 if cpu_decode_layers.available() else 2)
    general = run(True)
    for got, want in zip(direct, general, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)
