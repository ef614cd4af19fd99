"""Chunk assembly and SSE framing, fed directly (shapes the fake server never produces)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kaizen_server_extension.models.assembly import StepAssembler
from kaizen_server_extension.models.sse import iter_sse_data
from kaizen_server_extension.protocol.model import (
    ModelStepError,
    StepEvent,
    StepFinished,
    TextDelta,
    ThinkingDelta,
    ToolCallEmitted,
    Usage,
)
from kaizen_server_extension.protocol.tools import ToolCall


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> Any:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"choices": choices, **top}


def fragment(index: int, *, id: str | None = None, name: str | None = None,
             args: str | None = None) -> dict[str, Any]:  # fmt: skip
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    out: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        out["id"] = id
    return out


def run(chunks: list[Any], *, step: int = 0) -> list[StepEvent]:
    assembler = StepAssembler(step=step, requested_model="asked")
    events: list[StepEvent] = []
    for c in chunks:
        events.extend(assembler.feed_chunk(c))
    return events + assembler.finish()


def test_interleaved_fragments_of_parallel_calls_are_joined_per_index() -> None:
    events = run(
        [
            chunk({"tool_calls": [fragment(1, id="b", name="search_docs", args="")]}),
            chunk({"tool_calls": [fragment(0, id="a", name="get_weather", args='{"ci')]}),
            chunk({"tool_calls": [fragment(1, args='{"q":'), fragment(0, args='ty":"Rome"}')]}),
            chunk({"tool_calls": [fragment(1, args='"x"}')]}, "tool_calls"),
        ]
    )

    assert events[:2] == [
        ToolCallEmitted(ToolCall("a", "get_weather", '{"city":"Rome"}')),
        ToolCallEmitted(ToolCall("b", "search_docs", '{"q":"x"}')),
    ]


def test_calls_without_provider_ids_get_stable_step_scoped_ids() -> None:
    events = run([chunk({"tool_calls": [fragment(0, name="get_weather", args="{}")]})], step=4)

    assert events[0] == ToolCallEmitted(ToolCall("call_4_0", "get_weather", "{}"))


def test_reasoning_sent_under_both_names_is_shown_once() -> None:
    events = run([chunk({"reasoning_content": "think", "reasoning": "think", "content": "x"})])

    assert events[:2] == [ThinkingDelta("think"), TextDelta("x")]


def test_empty_and_null_deltas_yield_nothing_live() -> None:
    events = run([chunk({"role": "assistant", "content": ""}), chunk({"content": None}), chunk()])

    assert events == [StepFinished(Usage(), None, "asked")]


def test_usage_chunk_and_reported_model_are_kept() -> None:
    events = run(
        [
            chunk({"content": "hi"}, "stop", model="served-as"),
            chunk(usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
        ]
    )

    assert events[-1] == StepFinished(Usage(3, 2), "stop", "served-as")


@pytest.mark.parametrize(
    "bad",
    [
        ["not", "an", "object"],
        chunk({"tool_calls": ["nope"]}),
        chunk({"tool_calls": [{"index": "0", "function": {"arguments": "{}"}}]}),
    ],
)
def test_garbled_chunks_are_retryable_malformed_responses(bad: Any) -> None:
    with pytest.raises(ModelStepError) as caught:
        run([bad])

    assert (caught.value.code, caught.value.retryable) == ("provider_malformed_response", True)


async def lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


async def test_sse_framing_skips_comments_and_joins_multiline_data() -> None:
    source = lines(
        ": keep-alive", "", "event: message", "data: {\"a\":", "data: 1}", "",
        "data:[DONE]", "",
    )  # fmt: skip

    assert [d async for d in iter_sse_data(source)] == ['{"a":\n1}', "[DONE]"]


async def test_sse_event_without_trailing_blank_line_is_still_delivered() -> None:
    assert [d async for d in iter_sse_data(lines("data: last"))] == ["last"]
