"""One model step: live streaming, the commit, pre-commit retries and thinking isolation."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.model import ModelStepError, TextDelta, ThinkingDelta
from kaizen_server_extension.runtime.port import Budgets, TerminalStatus

from .fakes import FakeHost, Raise, call, calls, drive, finished, say


@pytest.mark.rule("R-036", "R-044")
async def test_answer_streams_live_then_commits_and_settles_once() -> None:
    host = FakeHost([say("Hello", " there")])
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.COMPLETED
    assert outcome.reason == "answered"
    assert outcome.answer == "Hello there"
    assert host.terminals == [outcome]
    committed = host.of("answer.committed")
    assert committed == [
        {
            "step": 1,
            "text": "Hello there",
            "model": "fake-model",
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "total_tokens": 15,
                "cost": None,
            },
        }
    ]
    # answer.committed comes before the terminal proposal.
    assert host.log.index("publish:answer.committed") < host.log.index("publish_terminal")


@pytest.mark.rule("R-015")
async def test_without_rules_text_is_published_before_the_step_finishes() -> None:
    host = FakeHost([say("Hello", " there")])
    await drive(host)

    first_delta = host.log.index("publish:answer.delta")
    finish = host.log.index("yield:StepFinished")
    assert first_delta < finish
    assert [d["text"] for d in host.of("answer.delta")] == ["Hello", " there"]


@pytest.mark.rule("R-008", "R-009", "R-010", "R-011")
async def test_transient_failure_resends_the_identical_snapshot_without_thinking() -> None:
    host = FakeHost(
        [
            [
                ThinkingDelta("secret plan"),
                Raise(ModelStepError("provider_timeout", retryable=True)),
            ],
            [ThinkingDelta("only thinking"), finished()],  # empty exchange: thinking alone
            say("Answer"),
        ]
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.COMPLETED
    first, second, third = host.snapshots
    assert first is second is third  # the very same immutable object
    assert first.digest() == third.digest()
    payload = repr(first)
    assert "secret plan" not in payload and "only thinking" not in payload
    # Thinking already shown stays in the member-visible trace.
    assert [t["text"] for t in host.of("thinking.delta")] == ["secret plan", "only thinking"]
    assert [r["reason"] for r in host.of("retry.scheduled")] == [
        "provider_timeout",
        "empty_response",
    ]
    # Every attempt presented the same bundle object.
    assert len({id(b) for kind, b in host.bundles if kind == "model_step"}) == 1


@pytest.mark.rule("R-011")
async def test_thinking_never_enters_later_model_history() -> None:
    host = FakeHost(
        [
            [ThinkingDelta("private reasoning"), call("c1", "search_docs"), finished()],
            say("Done"),
        ]
    )
    await drive(host)

    later = host.snapshots[1]
    assert all("private reasoning" not in m.content for m in later.messages)
    assert later.messages[-2].role == "assistant" and later.messages[-1].role == "tool"


@pytest.mark.rule("R-008", "R-352")
async def test_retries_are_bounded_by_the_budget() -> None:
    flaky = [Raise(ModelStepError("upstream_503", retryable=True))]
    host = FakeHost([flaky, flaky, flaky])
    outcome = await drive(host, budgets=Budgets(max_step_retries=2))

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "upstream_503"
    assert len(host.snapshots) == 3


@pytest.mark.rule("R-013")
async def test_no_automatic_retry_after_answer_text_was_published() -> None:
    host = FakeHost(
        [
            [TextDelta("Partial ans"), Raise(ModelStepError("provider_timeout", retryable=True))],
            say("never requested"),
        ]
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "provider_timeout"
    assert len(host.snapshots) == 1
    assert host.of("retry.scheduled") == []


@pytest.mark.rule("R-008", "R-013", "R-351")
async def test_deterministic_failure_is_never_replayed() -> None:
    host = FakeHost(
        [[Raise(ModelStepError("invalid_tool_schema", retryable=False))], say("unreachable")]
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "invalid_tool_schema"
    assert len(host.snapshots) == 1
    assert host.remaining == [say("unreachable")]  # the second script was never consumed


@pytest.mark.rule("R-008", "R-010")
async def test_blank_text_is_an_empty_exchange_not_a_commit() -> None:
    host = FakeHost([say("  ", "\n"), say("Real answer")])
    outcome = await drive(host)

    assert outcome.answer == "Real answer"
    assert host.snapshots[0] is host.snapshots[1]
    assert [d["text"] for d in host.of("answer.delta")] == ["Real answer"]


@pytest.mark.rule("R-013")
async def test_tool_calls_held_until_the_step_completes_are_retry_safe() -> None:
    host = FakeHost(
        [
            [call("c1", "search_docs"), Raise(ModelStepError("stream_reset", retryable=True))],
            calls(("c2", "search_docs")),
            say("Done"),
        ]
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.COMPLETED
    assert [r.call_id for r in host.requests] == ["c2"]  # c1 never dispatched
