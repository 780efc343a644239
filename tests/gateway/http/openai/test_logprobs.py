"""Logprobs through the official ``openai`` client, stream and not, chat (per-token objects)
and completions (the legacy shape), compared with the log-softmax of transformers' own logits
for the same tokens: the tiny random Llama in float64 on both sides."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.engine.runner.helpers import hf_logits, hf_model
from tests.gateway.conftest import TINY_ENGINE
from tests.gateway.harness import make_config, openai_client, run_gateway

pytestmark = pytest.mark.timeout(180)

MAX_TOKENS = 6
TOP = 4
# the engine's float64 forward matches transformers' to this (tests/engine/runner: its rotary
# tables are computed apart from transformers' float32 ones); a wrong distribution (after
# temperature, penalties, another position) is off by far more
ATOL = 1e-5


@pytest.fixture(scope="module")
def gw64(redis_url: str, tiny_model_dir: Path) -> Iterator[tuple[Any, openai.OpenAI]]:
    config = make_config(engine="real", model=str(tiny_model_dir),
                         engine_options={**TINY_ENGINE, "dtype": "float64"})
    with run_gateway(config, redis_url) as gw, openai_client(
            gw, redis_url, "lp", max_max_tokens=64) as client:
        yield gw, client


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Any:
    return hf_model(tiny_model_dir, torch.float64)


def _greedy_reference(model: Any, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the log-softmax row that chose each, from transformers' logits."""
    tokens = list(prompt)
    rows = []
    for _ in range(n):
        lp = torch.log_softmax(hf_logits(model, tokens)[-1], dim=-1)
        rows.append(lp)
        tokens.append(int(lp.argmax()))
    return tokens[len(prompt):], torch.stack(rows)


_BYTES = {c: b for b, c in bytes_to_unicode().items()}


def _token_bytes(tok: Any, token_id: int) -> list[int]:
    """A byte-level BPE token's bytes, read through transformers' own alphabet table."""
    return [_BYTES[c] for c in tok.convert_ids_to_tokens(token_id)]


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(rng.randrange(3, 20))]


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_match_transformers(gw64: tuple[Any, openai.OpenAI], reference: Any,
                                                stream: bool) -> None:
    gw, client = gw64
    prompt = _prompt(1 + stream)
    want_ids, want = _greedy_reference(reference, prompt, MAX_TOKENS)
    args: dict[str, Any] = {"model": gw.engine.model_name, "prompt": prompt, "temperature": 0,
                            "max_tokens": MAX_TOKENS, "logprobs": TOP,
                            "extra_body": {"ignore_eos": True}}
    if stream:
        chunks = [c for c in client.completions.create(**args, stream=True) if c.choices]
        text = "".join(c.choices[0].text for c in chunks)
        parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        lp = {k: [x for p in parts for x in getattr(p, k)] for k in
              ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    else:
        resp = client.completions.create(**args)
        text = resp.choices[0].text
        assert resp.choices[0].logprobs is not None
        lp = resp.choices[0].logprobs.model_dump()
    got = torch.tensor(lp["token_logprobs"], dtype=torch.float64)
    torch.testing.assert_close(got, want[torch.arange(MAX_TOKENS), want_ids], rtol=0, atol=ATOL)
    for row, top in zip(want, lp["top_logprobs"], strict=True):
        values = sorted(top.values(), reverse=True)
        ref = torch.topk(row, TOP).values[: len(values)]  # equal strings share one key
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float64), ref,
                                   rtol=0, atol=ATOL)
    offsets = [sum(len(t) for t in lp["tokens"][:i]) for i in range(MAX_TOKENS)]
    assert lp["text_offset"] == offsets
    tok = gw.engine.tokenizer
    assert text == tok.decode(want_ids, skip_special_tokens=True)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_match_transformers(gw64: tuple[Any, openai.OpenAI], reference: Any,
                                          stream: bool) -> None:
    gw, client = gw64
    tok = gw.engine.tokenizer
    messages = [{"role": "user", "content": f"Count to {3 + stream}"}]
    prompt = tok.encode(tok.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True),
                        add_special_tokens=False)
    want_ids, want = _greedy_reference(reference, prompt, MAX_TOKENS)
    args: dict[str, Any] = {"model": gw.engine.model_name, "messages": messages,
                            "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True,
                            "top_logprobs": TOP, "extra_body": {"ignore_eos": True}}
    if stream:
        chunks = [c for c in client.chat.completions.create(**args, stream=True) if c.choices]
        content = [x for c in chunks if c.choices[0].logprobs
                   for x in c.choices[0].logprobs.content or []]
    else:
        resp = client.chat.completions.create(**args)
        assert resp.choices[0].logprobs is not None
        content = resp.choices[0].logprobs.content or []
    assert len(content) == MAX_TOKENS
    for i, entry in enumerate(content):
        assert entry.bytes == _token_bytes(tok, want_ids[i])
        assert entry.logprob == pytest.approx(float(want[i, want_ids[i]]), abs=ATOL)
        top = torch.topk(want[i], TOP)
        assert [t.bytes for t in entry.top_logprobs] == [
            _token_bytes(tok, t) for t in top.indices.tolist()]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            top.values.tolist(), abs=ATOL)
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="replace")


def test_no_logprobs_unless_asked_and_zero_alternatives(gw64: tuple[Any, openai.OpenAI]) -> None:
    gw, client = gw64
    model = gw.engine.model_name
    plain = client.completions.create(model=model, prompt="a b", max_tokens=3)
    assert plain.choices[0].logprobs is None
    chat = client.chat.completions.create(model=model, max_tokens=3, logprobs=True,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].logprobs is not None
    assert all(e.top_logprobs == [] for e in chat.choices[0].logprobs.content or [])


BAD = [
    ("chat", {"logprobs": "yes"}, "logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("completion", {"logprobs": 21}, "logprobs"),
    ("completion", {"logprobs": True}, "logprobs"),
    ("completion", {"logprobs": 1.5}, "logprobs"),
]


@pytest.mark.parametrize("kind,body,param", BAD)
def test_bad_logprobs_are_400_naming_the_parameter(gw64: tuple[Any, openai.OpenAI], kind: str,
                                                   body: dict[str, Any], param: str) -> None:
    gw, client = gw64
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(model=gw.engine.model_name, max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}],
                                           extra_body=body)
        else:
            client.completions.create(model=gw.engine.model_name, prompt="x", max_tokens=2,
                                      extra_body=body)
    err = info.value.body
    assert isinstance(err, dict) and err.get("param") == param, err
