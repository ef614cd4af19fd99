"""ModelGateway.stream_step against the fake server over real HTTP."""

from __future__ import annotations

import json

import pytest

from kaizen_server_extension.protocol.model import (
    ChatMessage,
    ModelStepError,
    StepEvent,
    StepFinished,
    TextDelta,
    ThinkingDelta,
    ToolCallEmitted,
    Usage,
)
from kaizen_server_extension.protocol.tools import ToolCall
from tests.models.conftest import FakeFactory, GatewayFactory
from tests.models.helpers import (
    API_KEY,
    calls_of,
    collect,
    finished_of,
    snapshot_for,
    text_of,
)


async def test_text_arrives_as_several_deltas_then_one_finish(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": ["Hel", "lo, ", "world."]}]}])

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert events[:3] == [TextDelta("Hel"), TextDelta("lo, "), TextDelta("world.")]
    finished = finished_of(events)
    assert finished.finish_reason == "stop"
    assert finished.model == "fake-model"
    assert calls_of(events) == []


async def test_request_on_the_wire_is_the_built_payload(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "ok"}]}])

    await collect(gateway_for(fake), snapshot_for("hi", required_tool="get_weather"))

    [request] = fake.requests()
    assert request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}
    assert [t["function"]["name"] for t in request["tools"]] == ["get_weather"]
    assert "tool_choice" not in request


async def test_model_override_and_extra_params_reach_the_provider(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "ok"}]}])
    gateway = gateway_for(fake, extra_params={"temperature": 0.2, "stream": False})

    events = await collect(gateway, snapshot_for("hi"), model="other-model")

    [request] = fake.requests()
    assert request["model"] == "other-model"
    assert request["temperature"] == 0.2
    assert request["stream"] is True  # extra params never override gateway-owned keys
    assert finished_of(events).model == "other-model"


async def test_usage_and_reported_model_are_carried_by_the_finish_event(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(
        [
            {
                "responses": [
                    {
                        "text": "ok",
                        "model": "provider-side-name",
                        "usage": {"prompt_tokens": 31, "completion_tokens": 4, "cost": 0.0012},
                    }
                ]
            }
        ]
    )

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert finished_of(events) == StepFinished(
        usage=Usage(prompt_tokens=31, completion_tokens=4, cost=0.0012),
        finish_reason="stop",
        model="provider-side-name",
    )


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_thinking_deltas_come_from_either_reasoning_field_before_text(
    field: str, fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(
        [
            {
                "responses": [
                    {"thinking": ["Let me ", "think."], "thinking_field": field, "text": "42"}
                ]
            }
        ]
    )

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert events[:3] == [ThinkingDelta("Let me "), ThinkingDelta("think."), TextDelta("42")]


async def test_tool_calls_are_assembled_from_fragments_and_emitted_in_order(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    weather_args = '{"city": "Paris", "units": "metric"}'
    fake = fake_openai_factory(
        [
            {
                "responses": [
                    {
                        "text": "Checking.",
                        "tool_calls": [
                            {"id": "call_1", "name": "get_weather", "arguments": weather_args,
                             "fragments": 5},
                            {"id": "call_2", "name": "search_docs",
                             "arguments": {"query": "rain gear"}, "fragments": 2},
                        ],
                    }
                ]
            }
        ]
    )  # fmt: skip

    events = await collect(gateway_for(fake), snapshot_for("weather?"))

    assert calls_of(events) == [
        ToolCall("call_1", "get_weather", weather_args),
        ToolCall("call_2", "search_docs", json.dumps({"query": "rain gear"})),
    ]
    kinds = [type(e) for e in events]
    # Calls only after all text, and only once the step is complete.
    assert kinds == [TextDelta, ToolCallEmitted, ToolCallEmitted, StepFinished]
    assert finished_of(events).finish_reason == "tool_calls"


async def test_raw_string_arguments_are_passed_through_byte_for_byte(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    raw = '{"city":"Par'  # malformed on purpose: judging it is not the gateway's job
    fake = fake_openai_factory(
        [{"responses": [{"tool_calls": [{"id": "c", "name": "get_weather", "arguments": raw}]}]}]
    )

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert calls_of(events) == [ToolCall("c", "get_weather", raw)]


@pytest.mark.rule("R-011")
async def test_retry_of_a_step_that_showed_thinking_resends_it_without_the_thinking(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    secret_thought = "PRIVATE-CHAIN-OF-THOUGHT-9q"
    fake = fake_openai_factory(
        [
            {
                "responses": [
                    {
                        "attempts": [
                            {"thinking": secret_thought, "text": "partial", "cut_after_chunks": 3},
                            {"text": "whole answer"},
                        ]
                    }
                ]
            }
        ]
    )
    gateway = gateway_for(fake)
    snapshot = snapshot_for("q")

    shown: list[StepEvent] = []
    with pytest.raises(ModelStepError) as cut:
        async for event in gateway.stream_step(snapshot):
            shown.append(event)
    assert cut.value.retryable
    assert shown == [ThinkingDelta(secret_thought), TextDelta("partial")]

    second = await collect(gateway, snapshot)

    assert text_of(second) == "whole answer"
    first_request, retry_request = fake.requests()
    assert retry_request == first_request
    assert secret_thought not in json.dumps(retry_request)


async def test_assistant_history_and_tool_results_reach_the_provider(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(
        [
            {
                "match": "weather",
                "responses": [
                    {"tool_calls": [{"id": "call_w", "name": "get_weather",
                                     "arguments": {"city": "Oslo"}}]},
                    {"text": "Cold in Oslo."},
                ],
            }
        ]
    )  # fmt: skip
    gateway = gateway_for(fake)
    first = await collect(gateway, snapshot_for("weather in Oslo?"))
    [call] = calls_of(first)
    history = (
        ChatMessage(role="assistant", tool_calls=(call,)),
        ChatMessage(role="tool", content="-3C", tool_call_id=call.call_id),
    )

    second = await collect(gateway, snapshot_for("weather in Oslo?", history=history, step=1))

    assert text_of(second) == "Cold in Oslo."
    sent = fake.requests()[1]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_w"
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_w", "content": "-3C"}


async def test_an_empty_exchange_is_not_an_error_in_the_gateway(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"empty": True}]}])

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert len(events) == 1
    assert finished_of(events).finish_reason == "stop"


async def test_stream_without_done_is_accepted_once_finish_reason_arrived(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "fine", "no_done": True}]}])

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert text_of(events) == "fine"
    assert finished_of(events).finish_reason == "stop"


async def test_non_streaming_json_answers_are_understood(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(
        [
            {
                "responses": [
                    {
                        "thinking": "hmm",
                        "text": "Done.",
                        "tool_calls": [{"id": "c1", "name": "search_docs", "arguments": {}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 6},
                        "non_streaming": True,
                    }
                ]
            }
        ]
    )
    gateway = gateway_for(fake)

    events = await collect(gateway, snapshot_for("hi"))

    assert events == [
        ThinkingDelta("hmm"),
        TextDelta("Done."),
        ToolCallEmitted(ToolCall("c1", "search_docs", "{}")),
        StepFinished(Usage(5, 6), finish_reason="tool_calls", model="fake-model"),
    ]


async def test_api_key_is_sent_as_a_bearer_token(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "authorised"}]}], api_key=API_KEY)

    events = await collect(gateway_for(fake, api_key=API_KEY), snapshot_for("hi"))

    assert text_of(events) == "authorised"


async def test_list_models_reads_the_provider_catalog(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(models=["small", "large"])

    assert await gateway_for(fake).list_models() == ["small", "large"]


async def test_consecutive_steps_reuse_one_connection_to_the_model(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    """A streamed step is read to the end of its body, so the next step's request goes out
    on the same kept-alive connection instead of connecting anew."""
    fake = fake_openai_factory([{"responses": [{"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}]}] * 3 + [{"text": "done"}]}])
    gateway = gateway_for(fake)

    for _ in range(4):
        events = await collect(gateway, snapshot_for("hi"))
        assert finished_of(events).finish_reason in ("tool_calls", "stop")

    assert fake.request_count == 4
    assert fake.connection_count == 1
