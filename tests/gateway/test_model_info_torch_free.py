"""A gateway-only process learns the served model (name, limits, tokenizer) without torch,
and gets the same tokenizer ``AutoTokenizer`` would have given it."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from engine.model_files import load_tokenizer, plain_tokenizers_backend
from gateway.config import GatewayConfig
from gateway.model_info import load_model_info
from tests.torch_blocker import run_without_torch

SCRIPT = """
    import json, sys

    from gateway.config import GatewayConfig
    from gateway.model_info import load_model_info

    info = load_model_info(GatewayConfig(model=sys.argv[1], role="gateway"))
    ids = info.tokenizer.encode("Hello, world", add_special_tokens=False)
    print(json.dumps([info.name, info.max_model_len, info.vocab_size, ids,
                      "torch" in sys.modules]))
    try:  # the blocker works: the weights' loader needs torch
        import engine.runner.loader
    except ImportError as exc:
        print("blocked:", exc)
"""


def test_a_gateway_loads_the_model_info_without_torch(tiny_model_dir: Path) -> None:
    res = run_without_torch(SCRIPT, str(tiny_model_dir))
    assert res.returncode == 0, res.stderr
    name, max_len, vocab, ids, torch_loaded = json.loads(res.stdout.splitlines()[0])
    assert not torch_loaded
    assert "blocked: torch is blocked here" in res.stdout
    # the same facts as read here, where torch may load, through the reference tokenizer
    reference = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    hf = json.loads((tiny_model_dir / "config.json").read_text())
    assert name == tiny_model_dir.name
    assert max_len == hf["max_position_embeddings"]
    assert vocab == len(reference)
    assert ids == reference.encode("Hello, world", add_special_tokens=False)


TEXTS = ["Hello, world", "  leading spaces and\ttabs\n\nnewlines", "naïve café 東京 🙂",
         "<|im_start|>user\nhi<|im_end|>", "1234567890 + x**2 == y", ""]


def test_the_torch_free_tokenizer_is_the_one_auto_tokenizer_loads(tiny_model_dir: Path) -> None:
    assert plain_tokenizers_backend(tiny_model_dir)  # else this compares AutoTokenizer to itself
    ours = load_tokenizer(tiny_model_dir)
    reference = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    assert type(ours) is type(reference)
    assert len(ours) == len(reference)
    assert ours.all_special_tokens == reference.all_special_tokens
    assert (ours.eos_token_id, ours.bos_token_id) == (reference.eos_token_id, reference.bos_token_id)
    for text in TEXTS:
        for special in (False, True):
            got = ours.encode(text, add_special_tokens=special)
            assert got == reference.encode(text, add_special_tokens=special), text
            assert ours.decode(got) == reference.decode(got)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_other_folders_still_go_through_auto_tokenizer(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (qwen / f.name).write_bytes(f.read_bytes())
    config = json.loads((qwen / "config.json").read_text())
    (qwen / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    assert not plain_tokenizers_backend(qwen)  # transformers picks its own class for qwen2
    ours = load_tokenizer(qwen)
    reference = AutoTokenizer.from_pretrained(str(qwen), local_files_only=True)
    assert type(ours) is type(reference)
    assert load_model_info(GatewayConfig(model=str(qwen))).vocab_size == len(reference)
