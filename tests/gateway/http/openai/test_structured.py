"""Structured outputs and tool calls through the ``openai`` client against the whole stack
on the tiny random model (whose free output is noise): what it answers under a constraint
parses and validates, streamed or not, with n > 1, logprobs, seed and stop; tool calls come
back as ``tool_calls``; bad input is a 400 naming the field that never reaches the engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.gateway.conftest import TINY_ENGINE
from tests.gateway.harness import make_config, make_tenant, openai_client, run_gateway

pytestmark = pytest.mark.timeout(180)

MSGS = [{"role": "user", "content": "Describe a pet."}]
SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["cat", "dog", "bird"]}, "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["kind", "ok", "tags"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA,
                                                 "strict": True}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
                                                    "days": {"enum": [1, 2, 3]}},
                   "required": ["unit", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(tiny_gateway: Any, redis_url: str) -> Iterator[openai.OpenAI]:
    with openai_client(tiny_gateway, redis_url, "structured", max_max_tokens=96) as c:
        yield c


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def chat(client: openai.OpenAI, model: str, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, messages=MSGS,  # type: ignore[arg-type]
                                          **{"max_tokens": 80, **kw})


@pytest.mark.parametrize("extra", [
    {}, {"temperature": 1.0, "seed": 7}, {"logprobs": True, "top_logprobs": 2},
    {"n": 3, "temperature": 1.0},
])
def test_response_format_json_schema_validates(client: openai.OpenAI, model: str,
                                               extra: dict[str, Any]) -> None:
    resp = chat(client, model, response_format=FORMAT, **extra)
    assert len(resp.choices) == extra.get("n", 1)
    for choice in resp.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"
        if "logprobs" in extra:
            assert choice.logprobs is not None and choice.logprobs.content


def test_streamed_json_schema_is_the_same_answer(client: openai.OpenAI, model: str) -> None:
    whole = chat(client, model, response_format=FORMAT, temperature=0).choices[0].message.content
    chunks = list(chat(client, model, response_format=FORMAT, stream=True, temperature=0))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats_under_a_schema(client: openai.OpenAI, model: str) -> None:
    a, b = (chat(client, model, response_format=FORMAT, temperature=1.0, seed=11)
            for _ in range(2))
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stop_and_max_tokens_cut_a_constrained_answer(client: openai.OpenAI,
                                                      model: str) -> None:
    cut = chat(client, model, response_format=FORMAT, max_tokens=3)
    assert cut.choices[0].finish_reason == "length"
    stopped = chat(client, model, response_format=FORMAT, stop=['"ok"'])
    assert stopped.choices[0].finish_reason == "stop"
    assert '"ok"' not in stopped.choices[0].message.content


def test_json_object_and_vllm_guided_fields(client: openai.OpenAI, model: str) -> None:
    obj = chat(client, model, response_format={"type": "json_object"}, max_tokens=30)
    content = obj.choices[0].message.content
    assert content.startswith("{")
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    choice = chat(client, model, extra_body={"guided_choice": ["red", "green", "blue"]})
    assert choice.choices[0].message.content in ("red", "green", "blue")
    regex = client.completions.create(model=model, prompt="Code:", max_tokens=20,
                                      extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"})
    text = regex.choices[0].text
    assert len(text) == 6 and text[2] == "-" and text[:2].isupper(), text
    grammar = client.completions.create(
        model=model, prompt="Answer:", max_tokens=10,
        extra_body={"guided_grammar": 'start: "yes" | "no"'})
    assert grammar.choices[0].text in ("yes", "no")
    so = chat(client, model, extra_body={"structured_outputs": {"json": SCHEMA}})
    jsonschema.validate(json.loads(so.choices[0].message.content), SCHEMA)
    completion = client.completions.create(model=model, prompt="Pet:", max_tokens=80,
                                           extra_body={"guided_json": SCHEMA})
    jsonschema.validate(json.loads(completion.choices[0].text), SCHEMA)


def _args_valid(call: Any, tool: dict[str, Any]) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("choice,tool", [
    ("required", None), ({"type": "function", "function": {"name": "add"}}, ADD),
])
def test_tool_calls_come_back_as_tool_calls(client: openai.OpenAI, model: str, choice: Any,
                                            tool: dict[str, Any] | None) -> None:
    resp = chat(client, model, tools=[WEATHER, ADD], tool_choice=choice)
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.tool_calls is not None and len(msg.tool_calls) == 1
    called = tool or {"get_weather": WEATHER, "add": ADD}[msg.tool_calls[0].function.name]
    _args_valid(msg.tool_calls[0], called)


def test_auto_answers_text_or_a_call(client: openai.OpenAI, model: str) -> None:
    for seed in range(4):
        resp = chat(client, model, tools=[WEATHER], temperature=1.0, seed=seed)
        msg = resp.choices[0].message
        if msg.tool_calls:
            assert resp.choices[0].finish_reason == "tool_calls"
            _args_valid(msg.tool_calls[0], WEATHER)
        else:
            assert not (msg.content or "").startswith("<")


def test_a_streamed_tool_call_reassembles(client: openai.OpenAI, model: str) -> None:
    whole = chat(client, model, tools=[WEATHER], tool_choice="required", temperature=0)
    args = whole.choices[0].message.tool_calls[0].function.arguments
    with client.chat.completions.stream(model=model, messages=MSGS,  # type: ignore[arg-type]
                                        max_tokens=80, tools=[WEATHER],  # type: ignore[list-item]
                                        tool_choice="required", logprobs=True,
                                        temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.arguments == args and final.choices[0].finish_reason == "tool_calls"
    _args_valid(call, WEATHER)
    pieces = list(chat(client, model, tools=[WEATHER], tool_choice="required", stream=True,
                       temperature=0))
    deltas = [c.choices[0].delta.tool_calls for c in pieces
              if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0][0].id and deltas[0][0].function.name == "get_weather"
    assert all(d[0].index == 0 for d in deltas) and len(deltas) > 2  # arguments in pieces
    assert "".join(d[0].function.arguments or "" for d in deltas) == args


def test_history_with_tool_calls_and_results_is_accepted(client: openai.OpenAI,
                                                         model: str) -> None:
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"unit":"c","days":1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    resp = client.chat.completions.create(model=model, messages=history,  # type: ignore[arg-type]
                                          max_tokens=5, tools=[WEATHER])  # type: ignore[list-item]
    assert resp.usage is not None and resp.usage.prompt_tokens > 50


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "strin"}}}}, "response_format", "invalid_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "response_format",
     "unsupported_schema_feature"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name", None),
    ({"response_format": {"type": "xml"}}, "response_format", None),
    ({"guided_regex": "[a-"}, "guided_regex", "invalid_schema"),
    ({"guided_choice": []}, "guided_choice", None),
    ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex", None),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "big", "schema": {"enum": ["x" * 40_000]}}}}, "response_format",
     "grammar_too_large"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", None),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", None),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", None),
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "if": {}, "then": {}}}}]},
     "tools", "unsupported_schema_feature"),
]


@pytest.mark.parametrize("extra,param,code", BAD)
def test_bad_input_is_a_400_naming_the_field(client: openai.OpenAI, model: str,
                                             tiny_gateway: Any, extra: dict[str, Any],
                                             param: str, code: str | None) -> None:
    compiles = tiny_gateway.engine.engine.runner.grammars.compiles
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, model, extra_body=extra)
    err = info.value.body
    assert isinstance(err, dict) and err.get("param") == param, err
    if code is not None:
        assert err.get("code") == code, err
    assert tiny_gateway.engine.engine.runner.grammars.compiles == compiles  # never got there


def test_a_compile_past_the_time_limit_is_a_400(redis_url: str, tiny_model_dir: Any) -> None:
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=TINY_ENGINE,
                         grammar_compile_timeout_s=1e-6)
    key = make_tenant(redis_url, config.namespace, "slowcompile")
    with run_gateway(config, redis_url) as gw, openai.OpenAI(
            base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60) as c:
        model = gw.engine.model_name
        for _ in range(2):  # the second time: refused at once, from the cache
            with pytest.raises(openai.BadRequestError) as info:
                chat(c, model, response_format=FORMAT)
            assert info.value.body["code"] == "grammar_compile_timeout", info.value.body
            assert info.value.body["param"] == "response_format"
        assert gw.engine.engine.runner.grammars.compiles == 0


def test_n_streamed_tool_calls_each_reassemble(client: openai.OpenAI, model: str) -> None:
    chunks = list(chat(client, model, tools=[WEATHER, ADD], tool_choice="required", n=2,
                       temperature=1.0, seed=3, stream=True, logprobs=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        deltas = [d for c in mine for d in c.delta.tool_calls or []]
        name = deltas[0].function.name
        args = "".join(d.function.arguments or "" for d in deltas)
        _args_valid_json(name, args)
        assert mine[-1].finish_reason == "tool_calls"
        assert any(c.logprobs and c.logprobs.content for c in mine)


def _args_valid_json(name: str, args: str) -> None:
    tool = {"get_weather": WEATHER, "add": ADD}[name]
    jsonschema.validate(json.loads(args), tool["function"]["parameters"])
