"""The tool-call format parsed back, whole and streamed in any split of the text."""

from __future__ import annotations

import pytest

from gateway.http.openai.tool_calls import CallStream, finish_reason, parse_calls

CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris","days":2}}</tool_call>'
ARGS = '{"city":"Paris","days":2}'


def test_a_whole_call_is_a_tool_call_and_anything_else_content() -> None:
    content, calls = parse_calls(CALL)
    assert content is None and calls is not None
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ARGS}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert parse_calls("Hello") == ("Hello", None)
    assert parse_calls(CALL[:-3]) == (CALL[:-3], None)  # cut: content
    assert finish_reason("stop", True) == "tool_calls"
    assert finish_reason("length", True) == "length"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_any_split_streams_the_name_first_then_the_arguments(size: int) -> None:
    stream = CallStream(auto=True)
    deltas = []
    for i in range(0, len(CALL), size):
        deltas += stream.feed(CALL[i:i + size])
    deltas += stream.end()
    calls = [d["tool_calls"][0] for d in deltas]
    assert all("content" not in d for d in deltas)
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert calls[0]["id"] == stream.id and all(c["index"] == 0 for c in calls)
    assert "".join(c["function"]["arguments"] for c in calls) == ARGS
    assert stream.called


def test_auto_text_streams_at_once_and_a_cut_call_ends_as_it_is() -> None:
    text = CallStream(auto=True)
    assert text.feed("") == [] and text.feed("Hi") == [{"content": "Hi"}]
    assert text.feed(" there") == [{"content": " there"}] and text.end() == []
    cut = CallStream(auto=False)
    assert cut.feed("<tool_call>{\"na") == []
    assert cut.end() == [{"content": "<tool_call>{\"na"}] and not cut.called
    args_cut = CallStream(auto=False)
    args_cut.feed(CALL[:60])
    rest = args_cut.end()
    assert not args_cut.called and rest[-1]["tool_calls"][0]["function"]["arguments"]
