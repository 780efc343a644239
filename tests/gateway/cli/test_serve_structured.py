"""The ``openai`` SDK, unchanged, against a real ``carpool serve`` process (the tiny random
model, whose free output is noise): ``beta.chat.completions.parse`` with a pydantic model,
``chat.completions.create(tools=...)``, and a streamed tool call through the SDK's stream
helper."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.gateway.cli.test_serve import TINY, _curl_request, _serve

pytestmark = pytest.mark.timeout(180)


class Pet(BaseModel):
    kind: Literal["cat", "dog", "bird"]
    friendly: bool
    legs: int = Field(ge=0, le=8)


class GetWeather(BaseModel):
    """Weather in a city."""

    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=3)


def test_the_openai_sdk_parses_calls_and_streams_tools(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    with _serve(tiny_model_dir, tmp_path, *TINY) as proc:
        proc.wait_for(lambda: _curl_request(list(proc.lines)) is not None)
        found = _curl_request(list(proc.lines))
        assert found is not None
        url, headers, body = found
        key = headers["Authorization"].removeprefix("Bearer ")
        base = url.removesuffix("/chat/completions")
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
        model = str(body["model"])
        msgs = [{"role": "user", "content": "Describe a pet."}]

        parsed = client.beta.chat.completions.parse(
            model=model, messages=msgs, response_format=Pet, max_tokens=60)  # type: ignore[arg-type]
        pet = parsed.choices[0].message.parsed
        assert isinstance(pet, Pet) and 0 <= pet.legs <= 8

        tool = openai.pydantic_function_tool(GetWeather)
        resp = client.chat.completions.create(model=model, messages=msgs,  # type: ignore[arg-type]
                                              tools=[tool], tool_choice="required",
                                              max_tokens=60)
        call = resp.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert resp.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "GetWeather"  # type: ignore[union-attr]
        GetWeather.model_validate(json.loads(call.function.arguments))  # type: ignore[union-attr]

        with client.chat.completions.stream(model=model, messages=msgs,  # type: ignore[arg-type]
                                            tools=[tool], tool_choice="required",
                                            max_tokens=60) as stream:
            events = [e.type for e in stream]
            final = stream.get_final_completion()
        assert "tool_calls.function.arguments.delta" in events
        assert "tool_calls.function.arguments.done" in events
        streamed = final.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert isinstance(streamed.function.parsed_arguments, GetWeather)  # type: ignore[union-attr]
        assert final.choices[0].finish_reason == "tool_calls"
