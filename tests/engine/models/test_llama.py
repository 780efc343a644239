"""Our flattened-batch Llama forward vs transformers' own model on the same random weights."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.engine.runner.helpers import (
    BlockTables,
    chunk,
    hf_logits,
    hf_model,
    make_runner,
    step_logits,
)
from tests.model_factories import make_tiny_llama_dir

# transformers runs RMSNorm and rotary in fp32 even for an fp64 model; that bounds agreement.
ATOL = 1e-5


@pytest.fixture(scope="module")
def arch_dirs(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, smollm2_dir: Path
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("archs")
    return {
        "llama": tiny_model_dir,
        "mistral": make_tiny_llama_dir(root / "mistral", arch="mistral", seed=1,
                                       tokenizer_dir=smollm2_dir),
        "qwen2": make_tiny_llama_dir(root / "qwen2", arch="qwen2", seed=2, heads=4, kv_heads=1,
                                     tokenizer_dir=smollm2_dir),
        # llama with every optional bias (q/k/v/o and MLP) and no GQA
        "llama_bias": make_tiny_llama_dir(root / "llama_bias", seed=3, kv_heads=4,
                                          attention_bias=True, mlp_bias=True,
                                          tokenizer_dir=smollm2_dir),
    }


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 5, 9, 17, 33][:n]
    return [[rng.randrange(3, 49152) for _ in range(length)] for length in lengths]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "llama_bias"])
def test_one_flattened_step_matches_transformers(arch: str, arch_dirs: dict[str, Path]) -> None:
    runner = make_runner(arch_dirs[arch])
    ref = hf_model(arch_dirs[arch])
    prompts = _prompts(6)
    blocks = BlockTables(runner.num_blocks, runner.block_size)
    scheduled = [chunk(f"r{i}", p, 0, blocks) for i, p in enumerate(prompts)]
    ours = step_logits(runner, scheduled)
    for prompt, got in zip(prompts, ours, strict=True):
        torch.testing.assert_close(got, hf_logits(ref, prompt), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chunked_prefill_and_decode_through_paged_cache(
    arch: str, arch_dirs: dict[str, Path]
) -> None:
    """Request a prefills in chunks of 7 while b (already prefilled) decodes, then both decode;
    every computed row must match transformers on the whole sequence."""
    runner = make_runner(arch_dirs[arch])
    ref = hf_model(arch_dirs[arch])
    rng = random.Random(1)
    seq = {rid: [rng.randrange(3, 49152) for _ in range(30)] for rid in ("a", "b")}
    expected = {rid: hf_logits(ref, s) for rid, s in seq.items()}
    blocks = BlockTables(runner.num_blocks, runner.block_size, seed=3)
    done = {"a": 0, "b": 0}
    plan = {"a": [7, 7, 7, 1, 1, 1, 1], "b": [12, 1, 1, 1, 1, 1, 1]}
    for step in range(7):
        scheduled = []
        for rid in ("b", "a"):  # b first: order in the batch must not matter
            n = plan[rid][step]
            scheduled.append(chunk(rid, seq[rid][done[rid] : done[rid] + n], done[rid], blocks))
        for s, got in zip(scheduled, step_logits(runner, scheduled), strict=True):
            want = expected[s.request_id][s.start_pos : s.start_pos + len(s.token_ids)]
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
            done[s.request_id] += len(s.token_ids)
    assert done == {"a": 25, "b": 18}


def test_tied_embeddings(tmp_path: Path, smollm2_dir: Path) -> None:
    model_dir = make_tiny_llama_dir(tmp_path, seed=5, tie_word_embeddings=True,
                                    tokenizer_dir=smollm2_dir)
    runner = make_runner(model_dir)
    assert runner.model.lm_head is None
    prompt = _prompts(5)[-1]
    blocks = BlockTables(runner.num_blocks, runner.block_size)
    (got,) = step_logits(runner, [chunk("r", prompt, 0, blocks)])
    torch.testing.assert_close(got, hf_logits(hf_model(model_dir), prompt), atol=ATOL, rtol=0)


def test_llama3_rope_scaling_matches_transformers(tmp_path: Path, smollm2_dir: Path) -> None:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}
    model_dir = make_tiny_llama_dir(tmp_path, seed=6, rope_parameters=rope,
                                    tokenizer_dir=smollm2_dir)
    runner = make_runner(model_dir)
    prompt = _prompts(6, seed=7)[-1]  # 33 tokens: past original_max_position_embeddings
    blocks = BlockTables(runner.num_blocks, runner.block_size)
    (got,) = step_logits(runner, [chunk("r", prompt, 0, blocks)])
    torch.testing.assert_close(got, hf_logits(hf_model(model_dir), prompt), atol=ATOL, rtol=0)


def test_unsupported_rope_type_is_a_clear_error(tmp_path: Path, smollm2_dir: Path) -> None:
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 64}
    model_dir = make_tiny_llama_dir(tmp_path, rope_parameters=rope, tokenizer_dir=smollm2_dir)
    with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
        make_runner(model_dir)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lower_precision_dtypes_stay_close(dtype: str, tiny_model_dir: Path) -> None:
    prompt = _prompts(5)[-1]
    exact = make_runner(tiny_model_dir, "float64")
    low = make_runner(tiny_model_dir, dtype)
    assert low.kv_cache.dtype == getattr(torch, dtype)
    (want,) = step_logits(exact, [chunk("r", prompt, 0, BlockTables(64, 4))])
    (got,) = step_logits(low, [chunk("r", prompt, 0, BlockTables(64, 4))])
    assert got.dtype == getattr(torch, dtype)
    tol = 1e-4 if dtype == "float32" else 0.15
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)
