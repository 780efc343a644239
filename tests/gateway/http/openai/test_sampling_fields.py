"""OpenAI's and vLLM's sampling fields through the official ``openai`` client (vLLM's ones in
``extra_body``, as its users send them), against the real app, worker and engine on the tiny
random Llama: each field changes what comes back as it should, stream and not, and each bad
value is a 400 naming the parameter."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.gateway.harness import openai_client

pytestmark = pytest.mark.timeout(120)

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(tiny_gateway: Any, redis_url: str) -> Iterator[openai.OpenAI]:
    with openai_client(tiny_gateway, redis_url, "fields", max_max_tokens=64) as c:
        yield c


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def eos(tiny_gateway: Any) -> int:
    eos_id = tiny_gateway.engine.engine.runner.eos_token_id
    assert eos_id is not None
    return int(eos_id)


def complete(client: openai.OpenAI, model: str, stream: bool, **kwargs: Any) -> tuple[str, int]:
    """(text, completion tokens), streamed or not."""
    args: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 12, **kwargs}
    if not stream:
        resp = client.completions.create(**args)
        assert resp.usage is not None
        return resp.choices[0].text, resp.usage.completion_tokens
    chunks = list(client.completions.create(**args, stream=True,
                                            stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None
    return "".join(c.choices[0].text for c in chunks if c.choices), usage.completion_tokens


def chat(client: openai.OpenAI, model: str, stream: bool, **kwargs: Any) -> tuple[str, int]:
    args: dict[str, Any] = {"model": model, "max_tokens": 12,
                            "messages": [{"role": "user", "content": PROMPT}], **kwargs}
    if not stream:
        resp = client.chat.completions.create(**args)
        assert resp.usage is not None
        return resp.choices[0].message.content or "", resp.usage.completion_tokens
    chunks = list(client.chat.completions.create(**args, stream=True,
                                                 stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), \
        usage.completion_tokens


CALLS = [complete, chat]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("stream", [False, True])
def test_ignore_eos_runs_to_max_tokens_and_min_tokens_delays_eos(
        client: openai.OpenAI, model: str, eos: int, call: Any, stream: bool) -> None:
    force_eos = {"logit_bias": {str(eos): 100}}  # EOS is all but certain at every step
    _, n = call(client, model, stream, temperature=0, **force_eos)
    assert n == 1  # stops at once ...
    _, n = call(client, model, stream, temperature=0, extra_body={"ignore_eos": True},
                **force_eos)
    assert n == 12  # ... unless EOS is ignored
    _, n = call(client, model, stream, temperature=0, extra_body={"min_tokens": 5}, **force_eos)
    assert n == 6  # EOS banned while fewer than 5 tokens were generated (vLLM's rule)


def test_benchmark_run_with_ignore_eos_gets_exactly_max_tokens(
        client: openai.OpenAI, model: str, eos: int) -> None:
    """What vLLM's benchmark_serving, guidellm and llmperf send: many concurrent streamed
    requests, varied lengths, ignore_eos; every one must produce exactly max_tokens."""
    lengths = [3, 17, 40, 9, 64, 1, 25, 33]

    def one(i: int) -> int:
        stream = client.completions.create(
            model=model, prompt=f"{PROMPT} {i}", max_tokens=lengths[i], temperature=1.0,
            stream=True, stream_options={"include_usage": True},
            logit_bias={str(eos): 5}, extra_body={"ignore_eos": True})
        usage = list(stream)[-1].usage
        assert usage is not None
        return usage.completion_tokens

    with ThreadPoolExecutor(len(lengths)) as pool:
        assert list(pool.map(one, range(len(lengths)))) == lengths


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_forces_a_token(client: openai.OpenAI, model: str, tiny_gateway: Any,
                                   call: Any, stream: bool) -> None:
    token = 1000
    text, n = call(client, model, stream, temperature=1.0, logit_bias={str(token): 100},
                   extra_body={"ignore_eos": True})
    tok = tiny_gateway.engine.tokenizer
    assert n == 12 and text == tok.decode([token] * 12, skip_special_tokens=True)


@pytest.mark.parametrize("field", [{"top_k": 1}, {"min_p": 1.0}])
@pytest.mark.parametrize("stream", [False, True])
def test_top_k_one_and_min_p_one_are_greedy(client: openai.OpenAI, model: str,
                                            field: dict[str, Any], stream: bool) -> None:
    greedy = complete(client, model, stream, temperature=0, extra_body={"ignore_eos": True})
    for seed in (1, 2, 3):
        got = complete(client, model, stream, temperature=1.5, seed=seed,
                       extra_body={"ignore_eos": True, **field})
        assert got == greedy


@pytest.mark.parametrize("stream", [False, True])
def test_top_k_past_the_vocabulary_is_off(client: openai.OpenAI, model: str,
                                          stream: bool) -> None:
    """A top_k past the vocabulary (even past 64 bits) keeps every token, as no top_k does."""
    plain = complete(client, model, stream, temperature=1.5, seed=7,
                     extra_body={"ignore_eos": True})
    for top_k in (49152, 2**64):
        assert complete(client, model, stream, temperature=1.5, seed=7,
                        extra_body={"ignore_eos": True, "top_k": top_k}) == plain


@pytest.mark.parametrize("field", [{"extra_body": {"repetition_penalty": 2.0}},
                                   {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}])
@pytest.mark.parametrize("call", CALLS)
def test_penalties_reach_the_sampler(client: openai.OpenAI, model: str, field: dict[str, Any],
                                     call: Any) -> None:
    """Greedy on the random model repeats itself; a penalty must change that, the same way
    streamed or not."""
    base = {"temperature": 0, "max_tokens": 40}
    plain, _ = call(client, model, False, **base, extra_body={"ignore_eos": True})
    extra = {**field.get("extra_body", {}), "ignore_eos": True}
    rest = {k: v for k, v in field.items() if k != "extra_body"}
    penalised = call(client, model, False, **base, **rest, extra_body=extra)
    assert penalised[0] != plain
    assert call(client, model, True, **base, **rest, extra_body=extra) == penalised


BAD = [
    ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"top_k": "1"}, "top_k"),
    ({"min_p": 1.5}, "min_p"), ({"min_p": "x"}, "min_p"),
    ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 13}, "min_tokens"),
    ({"min_tokens": 2.0}, "min_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": "hi"}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"presence_penalty": []}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"49152": 1}}, "logit_bias"),  # past the vocabulary
    ({"logit_bias": {"-1": 1}}, "logit_bias"), ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),  # "²".isdigit(), but int("²") raises
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"5": "1"}}, "logit_bias"),
    ({"logit_bias": [5, 1]}, "logit_bias"),
    ({"ignore_eos": "yes"}, "ignore_eos"), ({"ignore_eos": 1}, "ignore_eos"),
]


@pytest.mark.parametrize("body,param", BAD)
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_bad_values_are_400_naming_the_parameter(client: openai.OpenAI, model: str,
                                                 body: dict[str, Any], param: str,
                                                 kind: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "x"}], max_tokens=12,
                extra_body=body)
        else:
            client.completions.create(model=model, prompt="x", max_tokens=12, extra_body=body)
    err = info.value.body
    assert isinstance(err, dict) and err.get("param") == param, err
