"""``kv_cache_dtype="float16"``: the cache holds fp16 keys and values (half the bytes a token),
and attention computes in the model's dtype on them. Checked against transformers with every
key (after rotary) and value rounded to fp16 before attention reads it, which is what such a
cache means; a request's tokens and logprobs are the same bits alone and in a batch; the
option is validated where configs are."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.core.config import FORCE_TRITON_ENV, EngineConfig
from engine.llm_engine import LLMEngine
from kernels import cpu_decode_layers
from tests.engine.runner.helpers import (
    BlockTables,
    chunk,
    hf_logits,
    hf_model,
    make_runner,
    step_logits,
    tokens_and_logprobs,
)


@pytest.fixture
def hf_fp16_kv(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """transformers' Llama with its keys (after rotary) and values rounded to fp16."""
    from transformers.models.llama import modeling_llama

    rotary = modeling_llama.apply_rotary_pos_emb

    def rounded(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = rotary(*args, **kwargs)
        return q, k.half().to(k.dtype)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", rounded)
    yield


def _round_values(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.v_proj.register_forward_hook(
            lambda _m, _i, out: out.half().to(out.dtype))


def test_chunked_prefill_and_decode_match_transformers_with_fp16_kv(
    tiny_model_dir: Path, hf_fp16_kv: None,
) -> None:
    runner = make_runner(tiny_model_dir, kv_cache_dtype="float16")
    assert runner.kv_cache.dtype == torch.float16
    rounded = hf_model(tiny_model_dir)
    _round_values(rounded)
    rng = random.Random(5)
    seq = {rid: [rng.randrange(3, 49152) for _ in range(24)] for rid in ("a", "b")}
    want = {rid: hf_logits(rounded, s) for rid, s in seq.items()}
    blocks = BlockTables(runner.num_blocks, runner.block_size, seed=2)
    done = {"a": 0, "b": 0}
    plan = {"a": [7, 7, 1, 1, 1], "b": [10, 1, 1, 1, 1]}
    for step in range(5):
        scheduled = [chunk(rid, seq[rid][done[rid]:done[rid] + plan[rid][step]], done[rid], blocks)
                     for rid in ("b", "a")]
        for s, got in zip(scheduled, step_logits(runner, scheduled), strict=True):
            ref = want[s.request_id][s.start_pos:s.start_pos + len(s.token_ids)]
            # the rounding points agree: transformers' fp32 rotary can move a key across an
            # fp16 rounding edge now and then, an ulp of fp16, far under what fp16 costs
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
            done[s.request_id] += len(s.token_ids)
    assert done == {"a": 17, "b": 14}


def test_fp16_kv_differs_from_the_unrounded_model(tiny_model_dir: Path,
                                                  hf_fp16_kv: None) -> None:
    """The comparison above can fail: an fp32 cache is far from the rounded reference."""
    prompt = [random.Random(6).randrange(3, 49152) for _ in range(24)]
    runner16 = make_runner(tiny_model_dir, kv_cache_dtype="float16")
    runner64 = make_runner(tiny_model_dir)
    blocks = BlockTables(runner16.num_blocks, runner16.block_size)
    got16 = step_logits(runner16, [chunk("a", prompt, 0, blocks)])[0]
    got64 = step_logits(runner64, [chunk("a", prompt, 0, blocks)])[0]
    rounded = hf_model(tiny_model_dir)
    _round_values(rounded)
    ref = hf_logits(rounded, prompt)
    assert (got64 - ref).abs().max() > 10 * (got16 - ref).abs().max()


@pytest.mark.skipif(not cpu_decode_layers.available(),
                    reason="whole-stack op not built (make setup): F.linear is not row-wise")
def test_an_fp16_kv_request_is_the_same_alone_and_in_a_batch(tiny_model_dir: Path) -> None:
    engine = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=128,
                                   kv_cache_dtype="float16", enable_prefix_caching=False)
    assert engine.runner.kv_cache.dtype == torch.float16
    prompts = [[5 + i, 17, 23 + 2 * i, 40, 7 + i, 11] for i in range(6)]  # 36 tokens a step
    alone = tokens_and_logprobs(engine, prompts[:1], 10)[0]
    batched = tokens_and_logprobs(engine, prompts, 10)
    assert len(alone[0]) == 10 and len(alone[1]) == 10
    assert batched[0] == alone
    assert len({tuple(tokens) for tokens, _ in batched}) > 1  # the batch's rows really differ


def test_fp16_kv_holds_twice_the_blocks_in_the_same_memory(tiny_model_dir: Path) -> None:
    fp32 = make_runner(tiny_model_dir, dtype="float32", num_blocks=None, kv_cache_memory_gb=0.01)
    fp16 = make_runner(tiny_model_dir, dtype="float32", num_blocks=None, kv_cache_memory_gb=0.01,
                       kv_cache_dtype="float16")
    assert fp16.bytes_per_block * 2 == fp32.bytes_per_block
    assert fp16.num_blocks in (2 * fp32.num_blocks, 2 * fp32.num_blocks + 1)
    assert fp16.cpu_cache.dtype == torch.float16  # swapped blocks keep their bytes


def test_kv_cache_dtype_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig.from_kwargs(kv_cache_dtype="int4")
    for bad in ({"device": "cuda"}, {"use_triton": True}, {"dtype": "bfloat16"}):
        with pytest.raises(ValueError, match="CPU path"):
            EngineConfig.from_kwargs(kv_cache_dtype="float16", **bad)
    assert EngineConfig.from_kwargs(kv_cache_dtype="float16").cache.kv_cache_dtype == "float16"
    monkeypatch.setenv(FORCE_TRITON_ENV, "1")  # Triton forced by the environment: the same
    with pytest.raises(ValueError, match="CPU path"):
        EngineConfig.from_kwargs(kv_cache_dtype="float16")
