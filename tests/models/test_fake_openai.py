"""The fake OpenAI server itself: scenario routing, attempts, introspection, CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.protocol.model import ChatMessage, ModelStepError
from kaizen_server_extension.protocol.tools import ToolCall
from kaizen_server_extension.testing.fake_openai import (
    ScenarioError,
    last_user_message,
    load_scenario_file,
    parse_scenario,
)
from tests.models.conftest import FakeFactory, GatewayFactory
from tests.models.helpers import calls_of, collect, snapshot_for, text_of

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


Chat = Callable[..., httpx.Response]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5, trust_env=False) as client:
        yield client


@pytest.fixture(scope="module")
def chat(http: httpx.Client) -> Chat:
    def send(base_url: str, user_text: str, *extra: dict[str, Any]) -> httpx.Response:
        """One non-streaming completion request, as a provider client would send it."""
        messages = [{"role": "user", "content": user_text}, *extra]
        return http.post(f"{base_url}/chat/completions", json={"model": "m", "messages": messages})

    return send


def test_unmatched_request_answers_500_naming_the_problem(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory([{"match": "only this", "responses": [{"text": "x"}]}])

    response = chat(fake.base_url, "something else")

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "no_script_matched"
    assert "something else" in response.json()["error"]["message"]


def test_request_past_the_last_response_answers_scenario_exhausted(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "only one"}]}])

    response = chat(fake.base_url, "q", {"role": "assistant", "content": "only one"})

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "scenario_exhausted"


def test_first_matching_script_wins_and_match_is_case_sensitive(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory(
        [
            {"match": "Paris", "responses": [{"text": "paris script"}]},
            {"responses": [{"text": "fallback"}]},
        ]
    )

    def answer(text: str) -> str:
        content: str = chat(fake.base_url, text).json()["choices"][0]["message"]["content"]
        return content

    assert answer("weather in Paris") == "paris script"
    assert answer("weather in paris") == "fallback"


def test_slot_counts_assistant_messages_after_the_last_user_message() -> None:
    messages = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": [{"type": "text", "text": "new "}, {"type": "text",
                                                                        "text": "question"}]},
        {"role": "assistant", "tool_calls": []},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "tool_calls": []},
        {"role": "tool", "content": "r"},
    ]  # fmt: skip

    assert last_user_message(messages) == ("new question", 2)


def test_fail_times_fails_the_first_hits_of_the_slot_then_succeeds(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory(
        [{"responses": [{"fail_times": 2, "error": {"status": 429}, "text": "finally"}]}]
    )

    statuses = [chat(fake.base_url, "q").status_code for _ in range(4)]

    assert statuses == [429, 429, 200, 200]


def test_attempts_are_consumed_in_order_and_the_last_repeats(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory(
        [{"responses": [{"attempts": [{"error": {"status": 503}}, {"text": "a"}, {"text": "b"}]}]}]
    )

    outcomes = []
    for _ in range(4):
        response = chat(fake.base_url, "q")
        outcomes.append(
            response.status_code
            if response.status_code != 200
            else response.json()["choices"][0]["message"]["content"]
        )

    assert outcomes == [503, "a", "b", "b"]


def test_reset_forgets_requests_and_attempt_counters(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory(
        [{"responses": [{"fail_times": 1, "error": {"status": 500}, "text": "ok"}]}]
    )
    assert chat(fake.base_url, "q").status_code == 500
    assert len(fake.requests()) == 1

    fake.reset()

    assert fake.requests() == []
    assert chat(fake.base_url, "q").status_code == 500


def test_load_replaces_the_scenario_at_runtime(
    fake_openai_factory: FakeFactory, chat: Chat
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "before"}]}])
    chat(fake.base_url, "q")

    fake.load({"scripts": [{"responses": [{"text": "after"}]}]})

    assert chat(fake.base_url, "q").json()["choices"][0]["message"]["content"] == "after"
    assert len(fake.requests()) == 1  # loading also resets


def test_invalid_scenario_posted_over_http_is_rejected_with_its_location(
    fake_openai_factory: FakeFactory, http: httpx.Client
) -> None:
    fake = fake_openai_factory()

    response = http.post(f"{fake.root_url}/_fake/scenario", json=[{"responses": [{"txt": "typo"}]}])

    assert response.status_code == 400
    assert "scripts[0].responses[0]" in response.json()["error"]["message"]
    assert "'txt'" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "scenario",
    [
        {"not": "a list"},
        [{"responses": []}],
        [{"match": 3, "responses": [{"text": "x"}]}],
        [{"responses": [{"empty": True, "text": "x"}]}],
        [{"responses": [{"fail_times": 0, "error": {"status": 500}}]}],
        [{"responses": [{"fail_times": 1, "text": "no error given"}]}],
        [{"responses": [{"error": {"status": 200}}]}],
        [{"responses": [{"tool_calls": [{"arguments": {}}]}]}],
        [{"responses": [{"thinking_field": "thoughts", "thinking": "x"}]}],
        [{"responses": [{"delay_ms": -1}]}],
    ],
)
def test_malformed_scenarios_are_refused(scenario: Any) -> None:
    with pytest.raises(ScenarioError):
        parse_scenario(scenario)


def test_shipped_scenario_files_are_valid() -> None:
    files = sorted(SCENARIOS.glob("*.json"))

    assert files
    for path in files:
        assert load_scenario_file(path), path.name


def test_models_endpoint_lists_the_configured_ids(
    fake_openai_factory: FakeFactory, http: httpx.Client
) -> None:
    fake = fake_openai_factory(models=["a", "b"])

    data = http.get(f"{fake.base_url}/models").json()["data"]

    assert [m["id"] for m in data] == ["a", "b"]


async def test_concurrent_conversations_each_follow_their_own_script(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    def conversation(name: str) -> dict[str, Any]:
        return {
            "match": f"conversation {name}",
            "responses": [
                {"tool_calls": [{"id": f"call_{name}", "name": "search_docs",
                                 "arguments": {"query": name}}], "chunk_delay_ms": 20},
                {"text": f"answer for {name}", "chunk_delay_ms": 20},
            ],
        }  # fmt: skip

    fake = fake_openai_factory([conversation("alpha"), conversation("beta")])
    gateway = gateway_for(fake)

    async def run_turn(name: str) -> tuple[list[ToolCall], str]:
        question = f"conversation {name}: please search"
        first = await collect(gateway, snapshot_for(question))
        calls = calls_of(first)
        history = (
            ChatMessage(role="assistant", tool_calls=tuple(calls)),
            *(ChatMessage(role="tool", content="r", tool_call_id=c.call_id) for c in calls),
        )
        second = await collect(gateway, snapshot_for(question, history=history, step=1))
        return calls, text_of(second)

    (alpha_calls, alpha_text), (beta_calls, beta_text) = await asyncio.gather(
        run_turn("alpha"), run_turn("beta")
    )

    assert alpha_calls == [ToolCall("call_alpha", "search_docs", '{"query": "alpha"}')]
    assert beta_calls == [ToolCall("call_beta", "search_docs", '{"query": "beta"}')]
    assert (alpha_text, beta_text) == ("answer for alpha", "answer for beta")
    asked_by = [r["messages"][1]["content"].split(":")[0] for r in fake.requests()]
    assert sorted(asked_by) == ["conversation alpha"] * 2 + ["conversation beta"] * 2
    assert asked_by[0] != asked_by[1]  # the two turns really were in flight together


async def test_a_retried_payload_lands_on_the_same_slot(
    fake_openai_factory: FakeFactory, gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory(
        [{"responses": [{"fail_times": 1, "error": {"status": 503}, "text": "second try"}]}]
    )
    gateway = gateway_for(fake)
    snapshot = snapshot_for("q")

    with pytest.raises(ModelStepError):
        await collect(gateway, snapshot)
    events = await collect(gateway, snapshot)

    assert text_of(events) == "second try"


def test_command_line_prints_the_port_and_serves_the_scenario(tmp_path: Path, chat: Chat) -> None:
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps([{"responses": [{"text": "from the cli"}]}]))
    command = [sys.executable, "-m", "kaizen_server_extension.testing.fake_openai",
               "--scenario", str(scenario), "--port", "0"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            port = json.loads(process.stdout.readline())["port"]
            response = chat(f"http://127.0.0.1:{port}/v1", "q")
            assert response.json()["choices"][0]["message"]["content"] == "from the cli"
        finally:
            process.terminate()
            assert process.wait(timeout=5) == 0


def test_command_line_rejects_an_invalid_scenario_file(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.json"
    scenario.write_text(json.dumps([{"responses": [{"txt": "typo"}]}]))

    result = subprocess.run(
        [sys.executable, "-m", "kaizen_server_extension.testing.fake_openai",
         "--scenario", str(scenario)],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip

    assert result.returncode == 2
    assert "'txt'" in result.stderr
