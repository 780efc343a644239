"""kernels.cpu_decode_layers: the whole decoder stack in one C++ call gives the same bits as
the same ops called one by one from Python (engine.models.cpu_decode_step.layer_forward), at 1
to 64 rows (past 32 the per-op path's linears are routed to the small-batch op too, as the
stack's are), on one and two threads, with contexts short and long enough (>= 1024 tokens in the
step) that decode attention splits rows across threads; and it is bound only where it
applies."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.models import cpu_decode_step
from engine.runner.model_runner import ModelRunner
from kernels import cpu_decode_layers, cpu_small_linear
from tests.engine.runner.helpers import BlockTables, chunk, make_runner

pytestmark = pytest.mark.skipif(not cpu_decode_layers.available(),
                                reason="whole-stack op not built (make setup)")


def _decode_hidden(runner: ModelRunner, contexts: list[int], seed: int) -> dict[str, torch.Tensor]:
    """Prefill rows of ``contexts`` tokens (general path), then one decode step twice on the
    same cache: with the whole-stack op and with the per-op path."""
    rng = random.Random(seed)
    blocks = BlockTables(runner.num_blocks, runner.block_size, seed=seed)
    seqs = {f"r{i}": [rng.randrange(3, 49152) for _ in range(n + 1)] for i, n in enumerate(contexts)}
    model = runner.model
    with torch.inference_mode():
        for rid, seq in seqs.items():  # one prompt a step: the cache holds every context
            step = runner.prepare_inputs([chunk(rid, seq[:-1], 0, blocks)])
            model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        step = runner.prepare_inputs([chunk(rid, seq[-1:], len(seq) - 1, blocks)
                                      for rid, seq in seqs.items()])
        out = {}
        for mode in ("stack", "per-op"):
            with pytest.MonkeyPatch.context() as m:
                # the per-op path routes a linear of over MAX_ROWS rows to oneDNN; the stack
                # runs every linear on the small op: compare like with like
                m.setattr(cpu_small_linear, "MAX_ROWS", cpu_decode_layers.MAX_TOKENS)
                if mode == "per-op":
                    m.setattr(cpu_decode_step, "stack_for", lambda model: None)
                fast = cpu_decode_step.prepare(model, step.input_ids, step.positions,
                                               runner.kv_caches, step.meta)
                assert fast is not None and (fast.stack is not None) == (mode == "stack")
                out[mode] = model(step.input_ids, step.positions, runner.kv_caches, step.meta)
    return out


@pytest.mark.parametrize("quantization", [None, "int8"])
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("contexts", [[7], [3, 40, 1100], [5 + 3 * i for i in range(32)],
                                      [4 + i for i in range(64)]],
                         ids=["1 row", "3 rows, 1143 tokens", "32 rows", "64 rows"])
def test_tiny_model_same_bits_as_per_op_path(tiny_model_dir: Path, contexts: list[int],
                                             n_threads: int, quantization: str | None,
                                             threads: None) -> None:
    torch.set_num_threads(n_threads)
    runner = make_runner(tiny_model_dir, "float32", block_size=16, num_blocks=400,
                         quantization=quantization)
    assert (cpu_decode_step.stack_for(runner.model) is not None)  # int8 weights too
    out = _decode_hidden(runner, contexts, seed=len(contexts))
    assert out["stack"].shape == (len(contexts), runner.args.hidden_size)
    assert torch.equal(out["stack"], out["per-op"])


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "float16"])
def test_smollm2_same_bits_as_per_op_path(kv_cache_dtype: str, threads: None) -> None:
    # SmolLM2's head size 64 and GQA 3:1 take the attention's compiled-in template (an fp16
    # cache: its halves widened in registers); 4 rows, 1293 tokens: the attention split across
    # both threads too. One row is the tiny model's case above (a real model's row costs ~5 s
    # of CI and runs the same template)
    contexts = [20, 1200, 9, 64]
    torch.set_num_threads(2)
    runner = make_runner(None, "float32", block_size=16, num_blocks=96, num_cpu_blocks=0,
                         kv_cache_dtype=kv_cache_dtype)
    out = _decode_hidden(runner, contexts, seed=3)
    assert torch.equal(out["stack"], out["per-op"])


def test_tiny_model_fp16_cache_same_bits_as_per_op_path(tiny_model_dir: Path,
                                                        threads: None) -> None:
    # head size 16: the attention's generic path, its fp16 rows widened into a buffer
    torch.set_num_threads(2)
    runner = make_runner(tiny_model_dir, "float32", block_size=16, num_blocks=400,
                         kv_cache_dtype="float16")
    assert runner.kv_cache.dtype == torch.float16
    out = _decode_hidden(runner, [3, 40, 1100], seed=5)
    assert torch.equal(out["stack"], out["per-op"])


def test_bound_only_on_small_batch_weights_and_rebound_when_linears_change(
    tiny_model_dir: Path
) -> None:
    bind = cpu_decode_step.stack_for
    model = make_runner(tiny_model_dir, "float32").model
    stack = bind(model)
    assert stack is not None and bind(model) is stack  # bound once
    assert bind(make_runner(tiny_model_dir, "float64").model) is None
    # a linear swapped after binding (as quantizing does): the old stack is not used again
    attn = model.layers[0].self_attn
    plain = torch.nn.Linear(attn.qkv_proj.in_features, attn.qkv_proj.out_features, bias=False)
    attn.qkv_proj = plain
    assert bind(model) is None


@pytest.mark.parametrize("padding", [0, 2], ids=["no padding", "2 padding rows"])
def test_prompt_chunk_after_a_prefix_beside_decode_rows(tiny_model_dir: Path, padding: int,
                                                        threads: None) -> None:
    # one decode row, one prompt chunk at positions 10..17 (its first 10 tokens already
    # cached), and a fixed-shape batch's padding rows: the whole stack and the per-op path give
    # the same bits; SDPA's general path the same numbers to rounding
    torch.set_num_threads(2)
    runner = make_runner(tiny_model_dir, "float32", block_size=16, num_blocks=160)
    rng = random.Random(7)
    a, b = ([rng.randrange(3, 49152) for _ in range(n)] for n in (21, 18))
    blocks = BlockTables(runner.num_blocks, runner.block_size, seed=7)
    model = runner.model
    out = {}
    with torch.inference_mode():
        for rid, seq, n in (("a", a, 20), ("b", b, 10)):
            step = runner.prepare_inputs([chunk(rid, seq[:n], 0, blocks)])
            model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        step = runner.prepare_inputs([chunk("a", a[20:], 20, blocks),
                                      chunk("b", b[10:], 10, blocks)], padding)
        for mode in ("stack", "per-op", "general"):  # general last: it writes other K/V bits
            with pytest.MonkeyPatch.context() as m:
                if mode != "stack":
                    m.setattr(cpu_decode_step, "stack_for", lambda model: None)
                if mode == "general":
                    m.setattr(cpu_decode_step, "prepare", lambda *args: None)
                out[mode] = model(step.input_ids, step.positions, runner.kv_caches, step.meta)
    real = 9  # 1 decode token + 8 prompt tokens; padding rows after them
    assert out["stack"].shape[0] == real + padding
    assert torch.equal(out["stack"], out["per-op"])
    torch.testing.assert_close(out["stack"][:real], out["general"][:real], atol=2e-5, rtol=2e-5)
