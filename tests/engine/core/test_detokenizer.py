"""Incremental detokenizer vs decoding the whole output at once (the SmolLM2 byte-level BPE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.core.detokenizer import IncrementalDetokenizer
from engine.runner.loader import load_tokenizer

TEXTS = [
    "héllo 世界 🎉 naïve café — ñandú, Ελληνικά, русский, 日本語のテキスト 👩‍👩‍👧",
    "plain ascii, with  double  spaces and\nnew lines\tand tabs",
    "emoji run 🎉🎉🚀🧪 and CJK 中文字符测试",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    return load_tokenizer(smollm2_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_equals_decoding_the_whole(tokenizer: Any, text: str) -> None:
    prompt = tokenizer.encode("Say something:", add_special_tokens=False)
    output = tokenizer.encode(text, add_special_tokens=False)
    assert any(tokenizer.decode([t]).endswith("\ufffd") for t in output) or text == TEXTS[1]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add([t]) for t in output]
    assert all("\ufffd" not in d for d in deltas)  # partial characters are held back
    assert "".join(deltas) == tokenizer.decode(output, skip_special_tokens=True) == text


def test_multi_token_adds_and_special_tokens(tokenizer: Any) -> None:
    text = TEXTS[0]
    output = tokenizer.encode(text, add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    output = output[:7] + [im_end] + output[7:] + [im_end]
    detok = IncrementalDetokenizer(tokenizer, [1, 2, 3])
    pieces = [detok.add(output[i : i + 3]) for i in range(0, len(output), 3)]
    assert "".join(pieces) == tokenizer.decode(output, skip_special_tokens=True) == text
    assert "<|im_end|>" not in "".join(pieces)


def test_first_token_keeps_its_leading_space(tokenizer: Any) -> None:
    prompt = tokenizer.encode("Hello", add_special_tokens=False)
    output = tokenizer.encode(" world", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    assert "".join(detok.add([t]) for t in output) == " world"


def test_flush_releases_an_incomplete_character(tokenizer: Any) -> None:
    output = tokenizer.encode("ok 🎉", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    text = "".join(detok.add([t]) for t in output[:-1])  # last byte(s) of the emoji missing
    assert text == "ok"
    rest = detok.flush()
    assert rest.endswith("\ufffd") and rest.startswith(" ")
    assert detok.flush() == ""
