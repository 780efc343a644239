"""engine.models.cpu_decode_step: a pure decode step on CPU fp32 takes the whole-stack op
(kernels.cpu_decode_layers) or, without it, the direct-op path; both give the same bits as the
general path (the same ops in the same order), and logits close to transformers' float64
model; prompt steps and float64 keep the general path."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.models import cpu_decode_step
from kernels import cpu_decode, cpu_decode_layers, cpu_layer_ops
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
    """Prefill three requests in one step, then five decode steps; logits of every step.
    mode: "stack" (as served), "ops" (the whole-stack op off) or "general" (both off);
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

        def layer(*args: object) -> object:
            taken.append("layer")
            return real_layer(*args)  # type: ignore[arg-type]

        def stack(*args: object) -> object:
            taken.append("stack")
            return real_stack(*args)  # type: ignore[arg-type]

        m.setattr(cpu_decode_step, "layer_forward", layer)
        m.setattr(cpu_decode_layers.DecodeLayers, "forward", stack)
        if mode != "stack":
            m.setattr(cpu_decode_step, "stack_for", lambda model: None)
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


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_direct_paths_same_bits_as_general_path(
    arch: str, tiny_model_dir: Path, qwen2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tiny_model_dir if arch == "llama" else qwen2_dir
    general = _run(model_dir, "float32", "general", monkeypatch, [])
    layers = len(make_runner(model_dir, "float32").model.layers)
    modes = ["ops"] + (["stack"] if cpu_decode_layers.available() else [])
    for mode in modes:
        taken: list[str] = []
        direct = _run(model_dir, "float32", mode, monkeypatch, taken)
        # every decode step, never the prompt step
        assert taken == (["stack"] * 5 if mode == "stack" else ["layer"] * 5 * layers)
        for got, want in zip(direct, general, strict=True):
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), mode


def test_direct_path_close_to_transformers(tiny_model_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runner_logits = _run(tiny_model_dir, "float32", "stack", monkeypatch, [])
    ref = hf_model(tiny_model_dir)
    rng = random.Random(4)
    seqs = [[rng.randrange(3, 49152) for _ in range(n)] for n in (9, 6, 14)]
    for i, seq in enumerate(seqs):
        want = hf_logits(ref, seq)
        for step in range(1, 6):  # decode step s computes position len - 5 + s - 1
            got = runner_logits[step][i]
            torch.testing.assert_close(got.double(), want[len(seq) - 6 + step:len(seq) - 5 + step],
                                       atol=1e-4, rtol=0)


def test_float64_keeps_the_general_path(tiny_model_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    _run(tiny_model_dir, "float64", "stack", monkeypatch, taken)
    assert taken == []
