"""A real server wired to the fake OpenAI-compatible model server, per backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BACKENDS, scripted_server
from tests.support.server import ServerProcess

SCRIPTS: list[dict[str, Any]] = [
    {"match": "say hello", "responses": [
        {"thinking": "A greeting is enough.", "text": "Hello from the model.",
         "usage": {"prompt_tokens": 11, "completion_tokens": 4}}]},
    {"match": "who can help", "responses": [
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "You can use General and Search."}]},
    {"match": "slow answer", "responses": [
        {"delay_ms": 4000, "text": "Finally."}]},
    {"match": "queued", "responses": [
        {"delay_ms": 150, "text": "Answered in order."}]},
    {"match": "flaky provider", "responses": [
        {"fail_times": 1, "error": {"status": 503}, "text": "Recovered after a retry."}]},
    {"match": "broken request", "responses": [
        {"error": {"status": 400, "body": {"error": {"message": "secret-ish provider text"}}}}]},
    {"match": "tool outside ceiling", "responses": [
        {"tool_calls": [{"name": "run_shell", "arguments": {"cmd": "id"}}]},
        {"text": "I cannot run that."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="session", params=BACKENDS)
def model_server(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # One fake per server: attempt counters (fail_times) must not leak between backends.
    root = tmp_path_factory.mktemp(f"model-server-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS,
                         {"AGENT_LOOP_MAX_CYCLES": "4"}) as proc:
        yield proc
