"""JSON tool calls returned in ``content`` by OpenAI-compatible servers (no model needed)."""

from __future__ import annotations

import json

import pytest

from kaizen_server_extension.models.content_tools import ContentToolCalls, tool_call_from_content
from kaizen_server_extension.protocol.model import (
    StepEvent,
    StepFinished,
    TextDelta,
    ToolCallEmitted,
)
from kaizen_server_extension.protocol.tools import ToolCall
from tests.models.conftest import FakeFactory, GatewayFactory
from tests.models.helpers import (
    SEARCH_TOOL,
    WEATHER_TOOL,
    calls_of,
    collect,
    finished_of,
    snapshot_for,
    text_of,
)

TOOLS = (WEATHER_TOOL, SEARCH_TOOL)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("text", [
    CALL,
    f"  {CALL}\n",
    f"```json\n{CALL}\n```",
    f"```\n{CALL}\n```",
    f"<tool_call>\n{CALL}\n</tool_call>",
    '{"tool": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
    '{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
])
def test_a_call_spelled_in_content_is_recognised(text: str) -> None:
    call = tool_call_from_content(text, TOOLS, call_id="call_7_0")
    assert call == ToolCall("call_7_0", "get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize("text", [
    "The weather in Paris is mild.",
    f"Sure! Here is the call: {CALL}",  # prose around it: text, not a call
    f"{CALL} and then some",
    "{not json at all",
    '{"name": "get_weather"',  # cut short
    '["get_weather", {"city": "Paris"}]',
    '{"name": "delete_everything", "arguments": {}}',  # not advertised
    '{"name": "get_weather", "arguments": {}}',  # misses the required city
    '{"name": "get_weather", "arguments": {"city": 12}}',  # wrong type
    '{"name": "get_weather", "arguments": "not json"}',
    '{"name": "Ada", "age": 36}',  # some other document with a "name"
    '{"name": "get_weather", "tool": "search_docs", "arguments": {}}',
    "```python\nprint('hi')\n```",
    "",
])
def test_anything_else_stays_text(text: str) -> None:
    assert tool_call_from_content(text, TOOLS) is None


def test_only_the_steps_advertised_tools_count() -> None:
    assert tool_call_from_content(CALL, (SEARCH_TOOL,)) is None
    assert tool_call_from_content(CALL, ()) is None


def _run(filter_: ContentToolCalls, events: list[StepEvent]) -> list[StepEvent]:
    out: list[StepEvent] = []
    for event in events:
        out.extend(filter_.feed(event))
    return out


def test_prose_streams_through_at_once() -> None:
    filter_ = ContentToolCalls(TOOLS, step=3)
    assert filter_.feed(TextDelta("Hel")) == [TextDelta("Hel")]
    assert filter_.feed(TextDelta("lo")) == [TextDelta("lo")]


def test_leading_whitespace_is_held_until_the_text_shows_what_it_is() -> None:
    filter_ = ContentToolCalls(TOOLS, step=3)
    assert filter_.feed(TextDelta("  ")) == []
    assert filter_.feed(TextDelta("Hi")) == [TextDelta("  Hi")]


def test_a_streamed_json_call_becomes_one_tool_call_before_the_finish() -> None:
    pieces = ["```json\n", '{"name": "get_', 'weather", "arguments": ', '{"city": "Paris"}}',
              "\n```"]
    out = _run(ContentToolCalls(TOOLS, step=3),
               [TextDelta(p) for p in pieces] + [StepFinished()])
    assert out == [ToolCallEmitted(ToolCall("call_3_0", "get_weather", '{"city": "Paris"}')),
                   StepFinished()]


def test_json_that_is_not_a_valid_call_is_released_as_text_at_the_end() -> None:
    text = '{"name": "get_weather", "arguments": {}}'
    out = _run(ContentToolCalls(TOOLS, step=3), [TextDelta(text), StepFinished()])
    assert out == [TextDelta(text), StepFinished()]


def test_native_tool_calls_win_and_the_content_stays_text() -> None:
    native = ToolCallEmitted(ToolCall("c1", "search_docs", '{"query": "x"}'))
    out = _run(ContentToolCalls(TOOLS, step=3),
               [TextDelta(CALL), native, StepFinished()])
    assert out == [TextDelta(CALL), native, StepFinished()]


def test_without_advertised_tools_nothing_is_held() -> None:
    filter_ = ContentToolCalls((), step=1)
    assert filter_.feed(TextDelta(CALL)) == [TextDelta(CALL)]


async def test_the_http_gateway_turns_content_json_into_a_call(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": ["```json\n", CALL, "\n```"]}]}])
    events = await collect(gateway_for(fake), snapshot_for("weather in Paris?", step=2))
    assert calls_of(events) == [ToolCall("call_2_0", "get_weather", '{"city": "Paris"}')]
    assert text_of(events) == ""
    finished_of(events)


async def test_the_http_gateway_leaves_invalid_content_json_as_text(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    bad = json.dumps({"name": "get_weather", "arguments": {"town": "Paris"}})
    fake = fake_openai_factory([{"responses": [{"text": [bad]}]}])
    events = await collect(gateway_for(fake), snapshot_for("weather in Paris?"))
    assert calls_of(events) == [] and text_of(events) == bad


async def test_the_http_gateway_ignores_content_json_when_no_tool_is_advertised(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": [CALL]}]}])
    events = await collect(gateway_for(fake), snapshot_for("weather?", tools=()))
    assert calls_of(events) == [] and text_of(events) == CALL
