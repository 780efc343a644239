"""The engine with the Triton path forced (interpreter) produces the same greedy tokens as with
the torch references, on a tiny random Llama, across chunked prefill and decode."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kernels
from engine.core.sampling_params import SamplingParams
from engine.frontend.llm import LLM
from tests.model_factories import make_tiny_llama_dir

# Lengths cross the 16-token block edge; a small token budget chunks the long prompts, so
# steps mix prefill chunks with decodes.
PROMPTS = [list(range(100, 105)), list(range(200, 223)), list(range(300, 340))]
PARAMS = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
ENGINE: dict[str, Any] = {"dtype": "float32", "block_size": 16, "num_blocks": 32, "num_cpu_blocks": 0,
          "max_num_batched_tokens": 24}


@pytest.fixture
def triton_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts calls into each Triton wrapper, so the test knows that path really ran."""
    counts: Counter[str] = Counter()
    for op in ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul",
               "write_kv_cache", "paged_attention"):
        real = getattr(kernels, f"{op}_triton")

        def counted(*args: Any, _op: str = op, _real: Any = real, **kwargs: Any) -> Any:
            counts[_op] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, f"{op}_triton", counted)
    yield counts


def _generate(model_dir: Path, use_triton: bool, **overrides: Any) -> list[list[int]]:
    llm = LLM(model=str(model_dir), use_triton=use_triton, **{**ENGINE, **overrides})
    return [out.token_ids for out in llm.generate(PROMPTS, PARAMS)]


def test_triton_path_matches_reference_greedy(
    tiny_model_dir: Path, triton_calls: Counter[str]
) -> None:
    expected = _generate(tiny_model_dir, use_triton=False)
    assert not triton_calls
    got = _generate(tiny_model_dir, use_triton=True)
    assert got == expected
    assert all(len(tokens) == PARAMS.max_tokens for tokens in got)
    # 2 layers x several steps: every op went through its Triton kernel.
    assert set(triton_calls) == {"rms_norm", "fused_add_rms_norm", "rotary_embedding",
                                 "silu_and_mul", "write_kv_cache", "paged_attention"}
    assert triton_calls["paged_attention"] >= 2 * PARAMS.max_tokens


def test_triton_path_matches_reference_gqa3_block32(
    tmp_path: Path, smollm2_dir: Path, triton_calls: Counter[str]
) -> None:
    # Three query heads per KV head (SmolLM2's ratio) and 32-token blocks.
    model_dir = make_tiny_llama_dir(tmp_path, num_layers=1, hidden=96, heads=6, kv_heads=2,
                                    seed=1, tokenizer_dir=smollm2_dir)
    expected = _generate(model_dir, use_triton=False, block_size=32, num_blocks=16)
    got = _generate(model_dir, use_triton=True, block_size=32, num_blocks=16)
    assert got == expected
    assert triton_calls["paged_attention"] >= PARAMS.max_tokens


def test_two_engines_in_one_process_keep_their_own_kernel_choice(
    tiny_model_dir: Path, triton_calls: Counter[str]
) -> None:
    forced = LLM(model=str(tiny_model_dir), use_triton=True, **ENGINE)
    reference = LLM(model=str(tiny_model_dir), use_triton=False, **ENGINE)  # built second
    forced.generate(PROMPTS[:1], PARAMS)
    assert triton_calls["paged_attention"] > 0
    triton_calls.clear()
    reference.generate(PROMPTS[:1], PARAMS)
    assert not triton_calls
