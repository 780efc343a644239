"""Stop strings and incremental text, on the real SmolLM2 tokenizer with hand-fed tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.core.output_processor import OutputProcessor
from engine.core.request import Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from engine.runner.loader import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    return load_tokenizer(smollm2_dir)


def feed(tokenizer: Any, text: str, stop: tuple[str, ...] = (), chunk: int = 1):
    """Feed ``text``'s tokens ``chunk`` at a time; return (deltas, outputs)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    req = Request("r", [1, 2], SamplingParams(max_tokens=len(ids), stop=stop))
    proc = OutputProcessor(tokenizer)
    proc.add(req)
    outs = []
    for i in range(0, len(ids), chunk):
        req.output_token_ids.extend(ids[i : i + chunk])
        if req.num_output_tokens == len(ids):
            req.status = RequestStatus.FINISHED_LENGTH
        out, _ = proc.process(req)
        outs.append(out)
        if out.finished:
            break
    return outs


@pytest.mark.parametrize("chunk", [1, 3])
def test_text_deltas_concatenate_to_decoded_text(tokenizer: Any, chunk: int) -> None:
    text = "Héllo wörld — naïve café, 東京 🚀 done."
    outs = feed(tokenizer, text, chunk=chunk)
    assert "".join(o.text_delta for o in outs) == text
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert all("\ufffd" not in o.text_delta for o in outs)


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_stop_string_ends_request_and_is_not_in_text(tokenizer: Any, chunk: int) -> None:
    outs = feed(tokenizer, "one two three STOP four five six", stop=("STOP",), chunk=chunk)
    text = "".join(o.text_delta for o in outs)
    assert text == "one two three "
    assert outs[-1].finished and outs[-1].finish_reason == "stop"


def test_partial_stop_prefix_is_held_back_then_released(tokenizer: Any) -> None:
    # "ST" could start "STOP", so it must not be streamed until it is known not to be one.
    outs = feed(tokenizer, "alpha STAR beta", stop=("STOP",), chunk=1)
    streamed = [o.text_delta for o in outs]
    assert "".join(streamed) == "alpha STAR beta"
    assert outs[-1].finish_reason == "length"


def test_earliest_of_several_stop_strings_wins(tokenizer: Any) -> None:
    outs = feed(tokenizer, "a b c END d STOP e", stop=("STOP", "END"), chunk=4)
    assert "".join(o.text_delta for o in outs) == "a b c "
    assert outs[-1].finish_reason == "stop"
