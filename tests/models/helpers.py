"""Shared builders for gateway tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kaizen_server_extension.models import ModelGateway
from kaizen_server_extension.protocol.model import (
    ChatMessage,
    StepEvent,
    StepFinished,
    StepSnapshot,
    TextDelta,
    ThinkingDelta,
    ToolCallEmitted,
)
from kaizen_server_extension.protocol.tools import AdvertisedTool, Capability, ToolCall

API_KEY = "sk-test-DO-NOT-LEAK-7f3a"


WEATHER_TOOL = AdvertisedTool(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    capability=Capability.READ,
)
SEARCH_TOOL = AdvertisedTool(
    name="search_docs",
    description="Search the documentation.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}},
    capability=Capability.READ,
)


def snapshot_for(
    user_text: str,
    *,
    history: Sequence[ChatMessage] = (),
    tools: Sequence[AdvertisedTool] = (WEATHER_TOOL, SEARCH_TOOL),
    required_tool: str | None = None,
    step: int = 0,
) -> StepSnapshot:
    messages = (
        ChatMessage(role="system", content="You are a helpful assistant."),
        ChatMessage(role="user", content=user_text),
        *history,
    )
    return StepSnapshot(
        step=step, messages=messages, tools=tuple(tools), required_tool=required_tool
    )


async def collect(gateway: ModelGateway, snapshot: StepSnapshot, **kw: Any) -> list[StepEvent]:
    return [event async for event in gateway.stream_step(snapshot, **kw)]


def text_of(events: Sequence[StepEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def thinking_of(events: Sequence[StepEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, ThinkingDelta))


def calls_of(events: Sequence[StepEvent]) -> list[ToolCall]:
    return [e.call for e in events if isinstance(e, ToolCallEmitted)]


def finished_of(events: Sequence[StepEvent]) -> StepFinished:
    assert events and isinstance(events[-1], StepFinished), "last event must be StepFinished"
    assert sum(isinstance(e, StepFinished) for e in events) == 1
    return events[-1]
