"""The single synthesis grant and the member-facing fallback."""

from __future__ import annotations

from typing import Any

import pytest

from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.runtime.fallback import (
    CHECK_ACTIVITY,
    fallback_message,
    suggests_activity_check,
)
from kaizen_server_extension.runtime.port import Budgets, TerminalStatus

from .fakes import SYNTHESIS, FakeHost, Item, call, calls, drive, finished, returns, say

SYNTH_TEXTS = {
    SYNTHESIS.with_evidence,
    SYNTHESIS.without_evidence,
    SYNTHESIS.without_evidence_after_failure,
}
EMPTY: list[Item] = [finished()]


def synthesis_steps(host: FakeHost) -> list[str]:
    """The synthesis instruction of every snapshot that carried one."""
    return [m.content for s in host.snapshots for m in s.messages if m.content in SYNTH_TEXTS]


@pytest.mark.rule("R-043", "R-073", "R-095")
async def test_exhausted_budget_grants_one_tool_free_synthesis_step_from_evidence() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), say("Answer from what I found")],
        tools={"search_docs": returns(evidence=True)},
    )
    outcome = await drive(host, budgets=Budgets(max_cycles=1))

    assert outcome.status is TerminalStatus.COMPLETED
    assert outcome.answer == "Answer from what I found"
    final = host.snapshots[-1]
    assert final.tools == () and final.required_tool is None
    assert final.messages[-1].content == SYNTHESIS.with_evidence
    assert host.of("model.step.started")[-1]["synthesis"] is True


@pytest.mark.rule("R-045", "R-046", "R-047")
@pytest.mark.parametrize(
    ("outcome", "instruction"),
    [
        (ToolOutcome.OK, SYNTHESIS.without_evidence),
        (ToolOutcome.TIMEOUT, SYNTHESIS.without_evidence_after_failure),
        (ToolOutcome.ERROR, SYNTHESIS.without_evidence_after_failure),
    ],
)
async def test_a_model_that_stops_without_answering_is_reprompted_by_evidence_state(
    outcome: ToolOutcome, instruction: str
) -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), EMPTY, say("I can't do that here.")],
        tools={"search_docs": returns(outcome)},
    )
    result = await drive(host, budgets=Budgets(max_step_retries=0))

    assert result.answer == "I can't do that here."
    assert synthesis_steps(host) == [instruction]  # the manifest's text, verbatim


@pytest.mark.rule("R-048")
async def test_empty_after_the_grant_with_evidence_fails_as_empty_response() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), EMPTY, EMPTY], tools={"search_docs": returns(evidence=True)}
    )
    outcome = await drive(host, budgets=Budgets(max_step_retries=0))

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "empty_response"
    assert host.terminals == [outcome]


@pytest.mark.rule("R-048")
async def test_empty_after_the_grant_without_evidence_is_answer_unavailable() -> None:
    host = FakeHost([calls(("c1", "search_docs")), EMPTY, EMPTY])
    outcome = await drive(host, budgets=Budgets(max_step_retries=0))

    assert outcome.status is TerminalStatus.ANSWER_UNAVAILABLE
    assert outcome.reason == "answer_unavailable"
    # All calls read-only and completed: no check-activity suggestion.
    assert CHECK_ACTIVITY not in (outcome.answer or "")


@pytest.mark.rule("R-008", "R-048")
async def test_the_grant_step_keeps_its_pre_commit_retries() -> None:
    host = FakeHost([EMPTY, EMPTY, say("Late answer")])
    outcome = await drive(host, budgets=Budgets(max_step_retries=1))

    assert outcome.answer == "Late answer"
    assert host.snapshots[0] is host.snapshots[1]  # regular step retried once
    assert host.snapshots[2].tools == ()  # then the one grant


@pytest.mark.rule("R-044")
async def test_the_grant_is_never_repeated() -> None:
    host = FakeHost([calls(("c1", "search_docs")), EMPTY, EMPTY, say("never asked")])
    outcome = await drive(host, budgets=Budgets(max_step_retries=0, max_cycles=5))

    assert outcome.reason == "answer_unavailable"
    assert len(synthesis_steps(host)) == 1
    assert len(host.snapshots) == 3
    assert len(host.terminals) == 1


@pytest.mark.rule("R-257", "R-044")
async def test_tool_calls_in_the_grant_step_are_non_delivery_and_never_run() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), [call("c2", "search_docs"), finished()]],
        tools={"search_docs": returns(evidence=True)},
    )
    outcome = await drive(host, budgets=Budgets(max_cycles=1))

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "non_delivery"
    assert [r.call_id for r in host.requests] == ["c1"]
    assert host.of("answer.committed") == []


# --- fallback -------------------------------------------------------------------------


def result(
    capability: Capability = Capability.READ,
    outcome: ToolOutcome = ToolOutcome.OK,
    **kwargs: Any,
) -> ToolCallResult:
    request = ToolCallRequest("c", "t", "{}", 1)
    return ToolCallResult(
        request.call_id, request.name, outcome, "x", capability=capability, **kwargs
    )


@pytest.mark.rule("R-049", "R-050")
@pytest.mark.parametrize(
    ("results", "suggest"),
    [
        ([], False),
        ([result(), result()], False),
        ([result(outcome=ToolOutcome.SUPPRESSED)], False),
        ([result(), result(Capability.WRITE)], True),
        ([result(Capability.SENSITIVE)], True),
        ([result(Capability.UNDECLARED)], True),
        ([result(delegated=True)], True),
        ([result(may_have_effect=True)], True),
        ([result(outcome=ToolOutcome.ERROR)], True),
        ([result(outcome=ToolOutcome.TIMEOUT)], True),
        ([result(outcome=ToolOutcome.ABANDONED)], True),
    ],
)
def test_check_activity_suggestion_matrix(results: list[ToolCallResult], suggest: bool) -> None:
    assert suggests_activity_check(results) is suggest
    assert (CHECK_ACTIVITY in fallback_message("answer_unavailable", results)) is suggest


@pytest.mark.rule("R-049")
async def test_a_failed_read_puts_the_suggestion_in_the_terminal_fallback() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), EMPTY, EMPTY],
        tools={"search_docs": returns(ToolOutcome.TIMEOUT)},
    )
    outcome = await drive(host, budgets=Budgets(max_step_retries=0))

    assert outcome.status is TerminalStatus.ANSWER_UNAVAILABLE
    assert CHECK_ACTIVITY in (outcome.answer or "")
