"""Failure classification: deterministic vs transient, with content-free codes only."""

from __future__ import annotations

import logging
import re
import socket
from typing import Any

import pytest

from kaizen_server_extension.models import errors
from kaizen_server_extension.protocol.model import ModelStepError, StepEvent, TextDelta
from tests.models.conftest import FakeFactory, GatewayFactory
from tests.models.helpers import API_KEY, collect, snapshot_for

PROVIDER_SECRET = "PROVIDER-INTERNAL-DETAIL-x81"


def provider_error_body(code: Any = None, param: Any = None) -> dict[str, Any]:
    # Providers often echo request content (and sometimes the key) in their messages.
    return {
        "error": {
            "message": f"{PROVIDER_SECRET}: bad thing with key {API_KEY}",
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }


async def failing_step(
    fake_openai_factory: FakeFactory,
    gateway_for: GatewayFactory,
    response: dict[str, Any],
    **gateway_overrides: Any,
) -> ModelStepError:
    fake = fake_openai_factory([{"responses": [response]}])
    gateway = gateway_for(fake, api_key=API_KEY, **gateway_overrides)
    with pytest.raises(ModelStepError) as caught:
        await collect(gateway, snapshot_for("hi"))
    return caught.value


def assert_content_free(error: ModelStepError) -> None:
    assert re.fullmatch(r"[a-z][a-z0-9_]*", error.code)
    assert error.code in errors.ALL_CODES
    rendered = " ".join([str(error), repr(error), *map(str, error.args)])
    assert PROVIDER_SECRET not in rendered
    assert API_KEY not in rendered
    # Not chained either, so a logged traceback cannot show the provider's words.
    assert error.__cause__ is None
    assert error.__suppress_context__ or error.__context__ is None


DETERMINISTIC = [
    pytest.param(400, provider_error_body(), "provider_invalid_request", id="400"),
    pytest.param(422, provider_error_body(), "provider_invalid_request", id="422"),
    pytest.param(404, provider_error_body("model_not_found"), "provider_model_not_found",
                 id="404-model"),
    pytest.param(400, provider_error_body("model_not_found", "model"), "provider_model_not_found",
                 id="400-invalid-model-id"),
    pytest.param(400, provider_error_body(None, "tools[0].function.parameters"),
                 "provider_tool_schema_rejected", id="400-tool-schema"),
    pytest.param(400, provider_error_body("unsupported_parameter", "temperature"),
                 "provider_invalid_request", id="400-parameter"),
    pytest.param(404, "<html>Not Found</html>", "provider_endpoint_not_found", id="404-bare"),
    pytest.param(401, provider_error_body("invalid_api_key"), "provider_auth", id="401"),
    pytest.param(403, provider_error_body(), "provider_auth", id="403"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "body", "code"), DETERMINISTIC)
async def test_deterministic_http_failures_are_not_retryable(
    status: int,
    body: Any,
    code: str,
    fake_openai_factory: FakeFactory,
    gateway_for: GatewayFactory,
) -> None:
    error = await failing_step(
        fake_openai_factory, gateway_for, {"error": {"status": status, "body": body}}
    )

    assert (error.code, error.retryable) == (code, False)
    assert_content_free(error)


TRANSIENT_HTTP = [
    pytest.param(429, "provider_rate_limited", id="429"),
    pytest.param(500, "provider_unavailable", id="500"),
    pytest.param(502, "provider_unavailable", id="502"),
    pytest.param(503, "provider_unavailable", id="503"),
]


@pytest.mark.parametrize(("status", "code"), TRANSIENT_HTTP)
async def test_transient_http_failures_are_retryable(
    status: int, code: str, fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    error = await failing_step(
        fake_openai_factory,
        gateway_for,
        {"error": {"status": status, "body": provider_error_body("server_error")}},
    )

    assert (error.code, error.retryable) == (code, True)
    assert_content_free(error)


async def test_refused_connection_is_retryable(gateway_for: GatewayFactory) -> None:
    with socket.socket() as probe:  # a port nobody listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gateway = gateway_for(f"http://127.0.0.1:{port}/v1", api_key=API_KEY)

    with pytest.raises(ModelStepError) as caught:
        await collect(gateway, snapshot_for("hi"))

    assert (caught.value.code, caught.value.retryable) == ("provider_connect_failed", True)
    assert_content_free(caught.value)


@pytest.mark.parametrize("base_url", ["ftp://127.0.0.1:1/v1", "http://[::1/v1"],
                         ids=["unsupported-protocol", "invalid-url"])
async def test_unusable_url_is_a_deterministic_misconfiguration(
    base_url: str, gateway_for: GatewayFactory
) -> None:
    """Past the start-up check (GatewayConfig refuses these), a URL the transport cannot use
    is still a deterministic misconfiguration, never a retry."""
    gateway = gateway_for("http://127.0.0.1:1/v1")
    object.__setattr__(gateway.config, "base_url", base_url)

    with pytest.raises(ModelStepError) as caught:
        await collect(gateway, snapshot_for("hi"))

    assert (caught.value.code, caught.value.retryable) == ("provider_misconfigured", False)


async def test_no_first_byte_within_read_timeout_is_retryable(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    error = await failing_step(
        fake_openai_factory, gateway_for, {"text": "late", "delay_ms": 3000}, read_timeout=0.2
    )

    assert (error.code, error.retryable) == ("provider_timeout", True)
    assert_content_free(error)


async def test_stall_between_chunks_is_a_retryable_timeout(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    error = await failing_step(
        fake_openai_factory,
        gateway_for,
        {"text": "one two", "chunk_delay_ms": 3000},
        read_timeout=0.2,
    )

    assert (error.code, error.retryable) == ("provider_timeout", True)


@pytest.mark.parametrize("cut_after", [0, 1, 3, 6])
async def test_stream_cut_before_done_is_retryable(
    cut_after: int, fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    # 0: before any byte; 1: after the role chunk; 3: mid-text; 6: after the finish chunk.
    fake = fake_openai_factory(
        [{"responses": [{"text": ["a", "b", "c"], "cut_after_chunks": cut_after}]}]
    )
    shown: list[StepEvent] = []

    with pytest.raises(ModelStepError) as caught:
        async for event in gateway_for(fake).stream_step(snapshot_for("hi")):
            shown.append(event)

    assert (caught.value.code, caught.value.retryable) == ("provider_stream_interrupted", True)
    assert all(isinstance(e, TextDelta) for e in shown)  # never a StepFinished
    assert_content_free(caught.value)


async def test_tool_calls_of_a_cut_stream_are_never_emitted(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(
        [{"responses": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "X"}}],
                         "cut_after_chunks": 5}]}]
    )  # fmt: skip
    shown: list[StepEvent] = []

    with pytest.raises(ModelStepError):
        async for event in gateway_for(fake).stream_step(snapshot_for("hi")):
            shown.append(event)

    assert shown == []


async def test_error_event_inside_a_200_stream_is_classified(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    transient = await failing_step(
        fake_openai_factory,
        gateway_for,
        {"text": "x", "stream_error": {"message": PROVIDER_SECRET, "code": 502}},
    )
    deterministic = await failing_step(
        fake_openai_factory,
        gateway_for,
        {"text": "x", "stream_error": {"message": PROVIDER_SECRET, "code": "model_not_found"}},
    )

    assert (transient.code, transient.retryable) == ("provider_unavailable", True)
    assert (deterministic.code, deterministic.retryable) == ("provider_model_not_found", False)
    assert_content_free(transient)
    assert_content_free(deterministic)


async def test_wrong_key_against_a_keyed_provider_is_an_auth_error(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "never"}]}], api_key="sk-the-right-one")

    with pytest.raises(ModelStepError) as caught:
        await collect(gateway_for(fake, api_key=API_KEY), snapshot_for("hi"))

    assert (caught.value.code, caught.value.retryable) == ("provider_auth", False)
    assert_content_free(caught.value)


async def test_unknown_model_id_is_deterministic(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "never"}]}], models=["fake-model"])

    with pytest.raises(ModelStepError) as caught:
        await collect(gateway_for(fake), snapshot_for("hi"), model="no-such-model")

    assert (caught.value.code, caught.value.retryable) == ("provider_model_not_found", False)


async def test_failures_are_logged_without_provider_text_or_key(
    caplog: pytest.LogCaptureFixture,
    fake_openai_factory: FakeFactory,
    gateway_for: GatewayFactory,
) -> None:
    caplog.set_level(logging.DEBUG)

    await failing_step(
        fake_openai_factory,
        gateway_for,
        {"error": {"status": 400, "body": provider_error_body()}},
    )

    assert PROVIDER_SECRET not in caplog.text
    assert API_KEY not in caplog.text


def test_every_code_is_classified_exactly_once() -> None:
    assert not errors.DETERMINISTIC_CODES & errors.RETRYABLE_CODES
    for code in errors.ALL_CODES:
        assert errors.step_error(code).retryable == (code in errors.RETRYABLE_CODES)
