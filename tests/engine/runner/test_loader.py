"""Model resolution: the bundled SmolLM2 (converted once to safetensors) and local HF folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.core.config import ModelConfig
from engine.runner import gguf_convert
from engine.runner.loader import (
    BUNDLED_NAME,
    load_hf_config,
    load_state_dict,
    resolve_model_dir,
)
from tests.engine.runner.helpers import (
    BlockTables,
    chunk,
    hf_logits,
    hf_model,
    make_runner,
    step_logits,
)


@pytest.mark.slow
def test_bundled_model_is_converted_once_and_then_loads_without_converting(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert smollm2_dir.name == BUNDLED_NAME
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # a plain checkpoint now, not a GGUF view
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30, 576, 49152)
    stamp = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    # A second start reads the safetensors folder: the GGUF conversion (~15 s) never runs
    # again. Checked by what happens, not by a time limit (a busy machine stretches any time).
    def no_conversion(*_args: object) -> None:
        raise AssertionError("the bundled GGUF was converted again")

    monkeypatch.setattr(gguf_convert, "convert_gguf", no_conversion)
    runner = make_runner(None, "float32", num_blocks=8, num_cpu_blocks=0)
    assert runner.model_dir == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == stamp  # not re-converted
    assert runner.model_name == BUNDLED_NAME
    assert runner.eos_token_id == runner.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert runner.tokenizer.chat_template


@pytest.mark.slow
def test_smollm2_logits_match_transformers_on_the_converted_weights(smollm2_dir: Path) -> None:
    runner = make_runner(None, "float32", num_blocks=16, num_cpu_blocks=0)
    tok = runner.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, tokenize=False,
    )
    ids = tok.encode(prompt, add_special_tokens=False)
    (got,) = step_logits(runner, [chunk("r", ids, 0, BlockTables(16, runner.block_size))])
    want = hf_logits(hf_model(smollm2_dir, torch.float32), ids)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)
    assert tok.decode(int(got[-1].argmax())) == tok.decode(int(want[-1].argmax()))


def test_local_dir_resolves_as_is_and_rejects_non_checkpoints(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert resolve_model_dir(str(tiny_model_dir)) == tiny_model_dir
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_dir(str(tmp_path))
    with pytest.raises(ValueError, match="model directory not found"):
        ModelConfig(model=str(tmp_path / "missing"))


def test_unsupported_architecture_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_hf_config(tmp_path)


def test_state_dict_is_cast_to_the_requested_dtype(tiny_model_dir: Path) -> None:
    state = load_state_dict(tiny_model_dir, torch.bfloat16)
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert "model.layers.0.self_attn.q_proj.weight" in state


def test_conversion_is_atomic_and_a_lost_race_is_harmless(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """convert_gguf's file handling, with transformers' GGUF reader stubbed by the tiny model
    (the real 15 s conversion runs once per machine through the smollm2_dir fixture)."""
    import transformers

    from engine.runner.gguf_convert import convert_gguf

    model = hf_model(tiny_model_dir, torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir),
                                                           local_files_only=True)
    calls: list[str] = []

    def fake_model(src: str, gguf_file: str, **kw: object) -> object:
        calls.append(gguf_file)
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **kw: tokenizer)
    target = tmp_path / "models" / "converted"
    convert_gguf(tmp_path / "fake.gguf", target)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    convert_gguf(tmp_path / "fake.gguf", target)  # another process finished first
    assert calls == ["fake.gguf", "fake.gguf"]
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp  # winner kept
    assert sorted(p.name for p in target.parent.iterdir()) == ["converted"]  # no temp left
    monkeypatch.undo()
    prompt = [5, 17, 300, 4000, 9]
    runner = make_runner(target)
    (got,) = step_logits(runner, [chunk("r", prompt, 0, BlockTables(64, 4))])
    torch.testing.assert_close(got, hf_logits(hf_model(tiny_model_dir), prompt), atol=1e-5,
                               rtol=0)
