"""Top-level request fields through the official ``openai`` client: unknown ones are ignored
(OpenAI's behaviour) unless the server runs with ``strict_api`` (400 naming the field);
fields Carpool knows but cannot honour are a 400 naming the field unless their value asks for
nothing (structured outputs and tools are honoured: ``test_structured.py``); ``stop_token_ids`` is honoured; ``usage.prompt_tokens_details.cached_tokens``
counts the prompt tokens the prefix cache served."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.conftest import TINY_ENGINE
from tests.gateway.harness import make_config, make_tenant, openai_client, run_gateway

pytestmark = pytest.mark.timeout(120)

MSGS = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def client(tiny_gateway: Any, redis_url: str) -> Iterator[openai.OpenAI]:
    with openai_client(tiny_gateway, redis_url, "apifields", max_max_tokens=64) as c:
        yield c


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def strict(redis_url: str, tiny_model_dir: Path) -> Iterator[tuple[openai.OpenAI, str]]:
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=TINY_ENGINE,
                         strict_api=True)
    key = make_tenant(redis_url, config.namespace, "strict")
    with run_gateway(config, redis_url) as gw, openai.OpenAI(
            base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60) as c:
        yield c, gw.engine.model_name


UNKNOWN = {"frobnicate": 3, "x_custom_tag": {"a": 1}}


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_fields_are_ignored_by_default(client: openai.OpenAI, model: str,
                                               stream: bool) -> None:
    args: dict[str, Any] = {"model": model, "messages": MSGS, "max_tokens": 6,
                            "temperature": 0}
    if stream:
        plain = "".join(c.choices[0].delta.content or ""
                        for c in client.chat.completions.create(**args, stream=True)
                        if c.choices)
        extra = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            **args, stream=True, extra_body=UNKNOWN) if c.choices)
    else:
        plain = client.chat.completions.create(**args).choices[0].message.content or ""
        extra = client.chat.completions.create(**args, extra_body=UNKNOWN
                                               ).choices[0].message.content or ""
    assert extra == plain
    resp = client.completions.create(model=model, prompt="a", max_tokens=2, extra_body=UNKNOWN)
    assert resp.usage is not None and resp.usage.completion_tokens >= 1


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_strict_api_refuses_unknown_fields_naming_them(strict: tuple[openai.OpenAI, str],
                                                       kind: str) -> None:
    client, model = strict
    for name, value in UNKNOWN.items():
        with pytest.raises(openai.BadRequestError) as info:
            _call(client, model, kind, {name: value})
        err = info.value.body
        assert isinstance(err, dict) and err.get("param") == name and name in err["message"]
    # the known fields still pass, vLLM's extras included
    _call(client, model, kind, {"top_k": 3, "ignore_eos": True, "user": "u1"})


def _call(client: openai.OpenAI, model: str, kind: str, extra: dict[str, Any]) -> Any:
    if kind == "chat":
        return client.chat.completions.create(model=model, messages=MSGS,  # type: ignore[arg-type]
                                              max_tokens=2, extra_body=extra)
    return client.completions.create(model=model, prompt="a", max_tokens=2, extra_body=extra)


UNHONOURABLE = [
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"tool_choice": "required"}, "tool_choice"),  # without tools
    ("chat", {"reasoning_effort": "high"}, "reasoning_effort"),
    ("chat", {"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
    ("completion", {"echo": True}, "echo"),
    ("completion", {"suffix": "end"}, "suffix"),
    ("completion", {"use_beam_search": True}, "use_beam_search"),
    ("completion", {"include_stop_str_in_output": True}, "include_stop_str_in_output"),
    ("completion", {"skip_special_tokens": False}, "skip_special_tokens"),
]
HARMLESS = [
    ("chat", {"tools": [], "tool_choice": "none", "response_format": {"type": "text"},
              "parallel_tool_calls": False, "store": False, "metadata": {"k": "v"}}),
    ("completion", {"echo": False, "suffix": None, "use_beam_search": False,
                    "skip_special_tokens": True}),
]


@pytest.mark.parametrize("kind,extra,param", UNHONOURABLE)
def test_fields_that_cannot_be_honoured_are_400(client: openai.OpenAI, model: str, kind: str,
                                                extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _call(client, model, kind, extra)
    err = info.value.body
    assert isinstance(err, dict) and err.get("param") == param, err


ECHO_UNHONOURABLE = [
    ("chat", {"n": 2}, "n"), ("completion", {"n": 3}, "n"),
    ("chat", {"logprobs": True}, "logprobs"), ("completion", {"logprobs": 0}, "logprobs"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind,extra,param", ECHO_UNHONOURABLE)
def test_the_echo_engine_refuses_n_and_logprobs(echo_gateway: Any, redis_url: str, kind: str,
                                               extra: dict[str, Any], param: str,
                                               stream: bool) -> None:
    """The echo engine makes one choice and no logprobs: asking for more is a 400 naming the
    field (it was empty choices, or a 500), and the same request without it is served."""
    key = make_tenant(redis_url, echo_gateway.config.namespace, "echo-fields")
    with openai.OpenAI(base_url=echo_gateway.url + "/v1", api_key=key, max_retries=0,
                       timeout=30) as c:
        with pytest.raises(openai.BadRequestError) as info:
            _call(c, "echo", kind, {**extra, "stream": stream})
        err = info.value.body
        assert isinstance(err, dict) and err.get("param") == param, err
        assert _call(c, "echo", kind, {}).usage.completion_tokens >= 1


@pytest.mark.parametrize("kind,extra", HARMLESS)
def test_harmless_values_of_those_fields_pass(client: openai.OpenAI, model: str, kind: str,
                                              extra: dict[str, Any]) -> None:
    resp = _call(client, model, kind, extra)
    assert resp.usage is not None and resp.usage.completion_tokens >= 1


def test_stop_token_ids_end_the_completion(client: openai.OpenAI, model: str) -> None:
    forced = {"logit_bias": {"1000": 100}}
    resp = client.completions.create(model=model, prompt="a", max_tokens=8, temperature=0,
                                     **forced, extra_body={"stop_token_ids": [1000]})
    assert resp.usage is not None and resp.usage.completion_tokens == 1
    assert resp.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt="a", max_tokens=2,
                                  extra_body={"stop_token_ids": [10 ** 6]})
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "stop_token_ids"


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_report_prefix_cache_hits(client: openai.OpenAI, model: str,
                                                stream: bool) -> None:
    rng = random.Random(10 + stream)
    prompt = [rng.randrange(3, 49152) for _ in range(45)]  # fresh: nothing cached yet
    block = TINY_ENGINE["block_size"]

    def cached() -> int | None:
        if stream:
            chunks = list(client.completions.create(
                model=model, prompt=prompt, max_tokens=2, stream=True,
                stream_options={"include_usage": True}))
            usage = chunks[-1].usage
        else:
            usage = client.completions.create(model=model, prompt=prompt, max_tokens=2).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return usage.prompt_tokens_details.cached_tokens

    assert cached() == 0
    # full blocks only, and the last prompt token is always computed (block_manager)
    assert cached() == (len(prompt) - 1) // block * block


def test_strict_api_from_the_environment_and_the_serve_flag() -> None:
    from gateway.cli.main import CONFIG_FLAGS, build_parser
    from gateway.config import GatewayConfig

    assert GatewayConfig.from_env({}).strict_api is False
    assert GatewayConfig.from_env({"CARPOOL_STRICT_API": "1"}).strict_api is True
    args = build_parser().parse_args(["serve", "--strict-api"])
    assert "strict_api" in CONFIG_FLAGS and args.strict_api is True
    assert build_parser().parse_args(["serve"]).strict_api is None  # the environment decides
