"""The int8-vs-fp32 quality check: its logits are transformers' (teacher-forced, every
position), it scores an engine against itself as identical, and the int8 engine is transformers
with every decoder linear's and the LM head's weight rounded to int8 (its perplexity recomputed here from the
logits)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.bench.quality import TEXTS, all_logits, compare
from engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> tuple[LLMEngine, LLMEngine]:
    fp32 = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=64)
    int8 = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=64,
                                 quantization="int8")
    return fp32, int8


def test_all_logits_are_transformers(engines: tuple[LLMEngine, LLMEngine],
                                     tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                              local_files_only=True).eval()
    ids = list(engines[0].tokenizer.encode(TEXTS[0], add_special_tokens=False))
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].double()
    torch.testing.assert_close(all_logits(engines[0], ids), ref, atol=2e-4, rtol=1e-4)


def test_an_engine_against_itself_agrees_everywhere(engines: tuple[LLMEngine, LLMEngine]) -> None:
    q = compare(engines[0], engines[0], TEXTS[:2])
    assert q.agreement == 1.0 and q.ppl == q.ppl_ref and q.positions > 10


def test_int8_is_the_model_with_its_layer_weights_rounded(
        engines: tuple[LLMEngine, LLMEngine], tiny_model_dir: Path) -> None:
    # independent reference: transformers with every layer linear's and the head's weight
    # replaced by its int8 rounding (q * scale), the embedding lookup and norms untouched
    from transformers import AutoModelForCausalLM

    from kernels.cpu_int8_linear import Int8Linear, quantize

    fp32, int8 = engines
    layers = int8.runner.model.layers
    assert all(isinstance(m, Int8Linear) for layer in layers for m in
               (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                layer.mlp.down_proj))
    assert isinstance(int8.runner.model.logits_linear, Int8Linear)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                              local_files_only=True).eval()
    with torch.no_grad():
        for module in hf.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                q, scale = quantize(module.weight)
                module.weight.copy_(q.float() * scale[:, None])
        # the head reads its own int8 copy; a tied embedding lookup keeps the fp32 table
        q, scale = quantize(hf.lm_head.weight)
        hf.lm_head.weight = torch.nn.Parameter(q.float() * scale[:, None])
    ids = list(fp32.tokenizer.encode(TEXTS[1], add_special_tokens=False))
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].double()
    a, b = all_logits(fp32, ids), all_logits(int8, ids)
    torch.testing.assert_close(b, ref, atol=2e-4, rtol=1e-4)
    assert not torch.equal(a, b)  # really quantized
    q = compare(fp32, int8, TEXTS[1:2])
    target = torch.tensor(ids[1:])
    ppl = math.exp(float(F.cross_entropy(b[:-1], target)))
    assert q.ppl == pytest.approx(ppl, rel=1e-9)
    assert 0.0 <= q.agreement <= 1.0


def test_int8_is_refused_off_cpu_fp32() -> None:
    from engine.core.config import ModelConfig

    with pytest.raises(ValueError, match="int8"):
        ModelConfig(dtype="float64", quantization="int8")
    with pytest.raises(ValueError, match="unsupported quantization"):
        ModelConfig(quantization="int4")
