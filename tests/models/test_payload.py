"""build_payload: the request body is a pure function of the snapshot."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kaizen_server_extension.models import build_payload
from kaizen_server_extension.protocol.model import ChatMessage, ModelStepError, StepSnapshot
from kaizen_server_extension.protocol.tools import AdvertisedTool, Capability, ToolCall
from tests.models.helpers import SEARCH_TOOL, WEATHER_TOOL, snapshot_for

TOOL_ROUND = (
    ChatMessage(
        role="assistant",
        content="",
        tool_calls=(
            ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
            ToolCall("call_b", "search_docs", '{"query":"umbrella"}'),
        ),
    ),
    ChatMessage(role="tool", content="sunny, 24C", tool_call_id="call_a", name="get_weather"),
    ChatMessage(role="tool", content="no results", tool_call_id="call_b", name="search_docs"),
)


def test_streaming_request_asks_for_usage() -> None:
    payload = build_payload(snapshot_for("hi"), "m-1")

    assert payload["model"] == "m-1"
    assert payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True}
    assert "tool_choice" not in payload


def test_non_streaming_request_has_no_stream_options() -> None:
    payload = build_payload(snapshot_for("hi"), "m-1", stream=False)

    assert payload["stream"] is False
    assert "stream_options" not in payload


def test_tools_become_function_specs_in_catalog_order() -> None:
    payload = build_payload(snapshot_for("hi"), "m")

    assert payload["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": dict(WEATHER_TOOL.parameters),
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search_docs",
                "description": "Search the documentation.",
                "parameters": dict(SEARCH_TOOL.parameters),
            },
        },
    ]


def test_no_tools_key_when_catalog_is_empty() -> None:
    assert "tools" not in build_payload(snapshot_for("hi", tools=()), "m")


@pytest.mark.rule("R-303")
def test_required_tool_is_the_only_tool_advertised_and_no_tool_choice_is_sent() -> None:
    payload = build_payload(snapshot_for("hi", required_tool="search_docs"), "m")

    assert [t["function"]["name"] for t in payload["tools"]] == ["search_docs"]
    assert "tool_choice" not in payload


def test_required_tool_outside_the_catalog_is_a_deterministic_error() -> None:
    with pytest.raises(ModelStepError) as caught:
        build_payload(snapshot_for("hi", tools=(WEATHER_TOOL,), required_tool="run_code"), "m")

    assert caught.value.code == "required_tool_not_in_catalog"
    assert caught.value.retryable is False


def test_assistant_tool_calls_and_tool_results_keep_their_ids_and_raw_arguments() -> None:
    payload = build_payload(snapshot_for("weather?", history=TOOL_ROUND), "m")

    assert payload["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "search_docs", "arguments": '{"query":"umbrella"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 24C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "no results"},
    ]


def test_plain_messages_carry_role_and_content_only() -> None:
    snapshot = StepSnapshot(
        step=0,
        messages=(
            ChatMessage(role="system", content="sys"),
            ChatMessage(role="user", content="q", name="alice@example.org"),
            ChatMessage(role="assistant", content="a"),
        ),
        tools=(),
    )

    assert build_payload(snapshot, "m")["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def test_nested_read_only_mappings_in_tool_parameters_are_json_encodable() -> None:
    tool = AdvertisedTool(
        name="t",
        description="d",
        parameters=MappingProxyType(
            {"type": "object", "properties": MappingProxyType({"x": {"enum": ("a", "b")}})}
        ),
        capability=Capability.READ,
    )

    payload = build_payload(snapshot_for("hi", tools=(tool,)), "m")

    assert json.loads(json.dumps(payload))["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"x": {"enum": ["a", "b"]}},
    }


@settings(max_examples=40, deadline=None)
@given(
    texts=st.lists(st.text(max_size=40), min_size=1, max_size=6),
    required=st.sampled_from([None, "get_weather", "search_docs"]),
)
def test_same_snapshot_always_gives_the_same_bytes(texts: list[str], required: str | None) -> None:
    history = tuple(ChatMessage(role="assistant", content=t) for t in texts)
    snapshot = snapshot_for("q", history=history, required_tool=required)

    first = json.dumps(build_payload(snapshot, "m"))
    second = json.dumps(build_payload(snapshot, "m"))

    assert first == second
