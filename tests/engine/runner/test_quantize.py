"""engine.runner.quantize: an int8 engine's request gives the same tokens and logprobs, bit for
bit, alone and beside other requests (its steps within the whole-stack op's tokens, where every
int8 linear runs a row on its own), and every layer linear and the head are int8."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm_engine import LLMEngine
from kernels import cpu_decode_layers
from kernels.cpu_int8_linear import Int8Linear
from tests.engine.runner.helpers import tokens_and_logprobs


@pytest.mark.skipif(not cpu_decode_layers.available(),
                    reason="whole-stack op not built (make setup): F.linear is not row-wise")
def test_an_int8_request_is_the_same_alone_and_in_a_batch(tiny_model_dir: Path) -> None:
    engine = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=128,
                                   quantization="int8", enable_prefix_caching=False)
    model = engine.runner.model
    assert isinstance(model.logits_linear, Int8Linear)
    assert all(isinstance(m, Int8Linear) for layer in model.layers
               for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                         layer.mlp.gate_up_proj, layer.mlp.down_proj))
    prompts = [[5 + i, 17, 23 + 2 * i, 40, 7 + i, 11] for i in range(6)]  # 36 tokens a step
    alone = tokens_and_logprobs(engine, prompts[:1])[0]
    batched = tokens_and_logprobs(engine, prompts)
    assert len(alone[0]) == 12 and len(alone[1]) == 12
    assert batched[0] == alone
    assert len({tuple(tokens) for tokens, _ in batched}) > 1  # the batch's rows really differ
