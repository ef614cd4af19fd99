"""Authority, cancellation, inactivity and the single terminal."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.authority import AuthorityRejected
from kaizen_server_extension.protocol.errors import RunCancelled
from kaizen_server_extension.protocol.model import ModelStepError, TextDelta
from kaizen_server_extension.runtime.controller import CANCELLED, STOOD_DOWN, TurnController
from kaizen_server_extension.runtime.port import Budgets, CorrectionRule, HostPort, TerminalStatus

from .fakes import (
    BUNDLE,
    Advance,
    FakeHost,
    Hang,
    Raise,
    calls,
    drive,
    finished,
    manifest,
    raises,
    returns,
    say,
)


@pytest.mark.rule("R-006", "R-007", "R-009", "R-029")
async def test_every_port_call_presents_the_admitted_bundle_unchanged() -> None:
    host = FakeHost(
        [
            [Raise(ModelStepError("x", retryable=True))],
            calls(("c1", "search_docs"), ("c2", "search_docs")),
            say("Done"),
        ],
        tools={"search_docs": returns(delay=0.03)},
    )
    await drive(
        host,
        budgets=Budgets(max_parallel_tools=2, inactivity_ms=30),
        correction_rules=(CorrectionRule("r", "zzz", "nope"),),
    )

    kinds = {kind for kind, _ in host.bundles}
    assert kinds == {"model_step", "call_tool", "publish", "publish_terminal", "heartbeat"}
    assert all(bundle is BUNDLE for _, bundle in host.bundles)
    assert all(BUNDLE.differing_fields(bundle) == [] for _, bundle in host.bundles)


def test_the_fake_host_implements_the_port() -> None:
    assert isinstance(FakeHost([]), HostPort)


@pytest.mark.rule("R-014")
async def test_a_lost_compare_and_set_stands_down_quietly() -> None:
    host = FakeHost([say("Answer")], terminal_accepts=False)
    controller = TurnController(host, manifest(), clock=host.clock)
    outcome = await controller.run()

    assert outcome == STOOD_DOWN
    assert controller.settled is False
    assert len(host.terminals) == 1
    assert host.log[-1] == "publish_terminal"  # nothing after the refused terminal


@pytest.mark.rule("R-014")
async def test_a_controller_runs_once() -> None:
    host = FakeHost([say("Answer")])
    controller = TurnController(host, manifest(), clock=host.clock)
    await controller.run()
    assert controller.settled is True
    with pytest.raises(RuntimeError):
        await controller.run()
    assert len(host.terminals) == 1


@pytest.mark.rule("R-262")
async def test_cancellation_from_the_model_stream_settles_nothing() -> None:
    host = FakeHost([[TextDelta("par"), Raise(RunCancelled())]])
    outcome = await drive(host)

    assert outcome == CANCELLED
    assert host.terminals == []
    assert host.of("answer.committed") == []


@pytest.mark.rule("R-262", "R-293")
async def test_cancellation_from_a_tool_stops_the_others_without_settling() -> None:
    host = FakeHost(
        [calls(("slow", "search_docs"), ("boom", "write_note")), say("unreachable")],
        tools={"search_docs": returns(delay=5), "write_note": raises(RunCancelled())},
    )
    outcome = await drive(host, budgets=Budgets(max_parallel_tools=2))

    assert outcome == CANCELLED
    assert host.terminals == []
    assert host.cancelled_tools == 1  # the slow call was cancelled, not awaited for 5 s
    assert len(host.snapshots) == 1


@pytest.mark.rule("R-262", "R-293")
async def test_a_cancelled_heartbeat_cancels_the_running_tool() -> None:
    host = FakeHost(
        [calls(("slow", "search_docs"))],
        tools={"search_docs": returns(delay=5)},
        heartbeat_error=RunCancelled(),
    )
    outcome = await drive(host, budgets=Budgets(inactivity_ms=15))

    assert outcome == CANCELLED
    assert host.heartbeats == 1
    assert host.cancelled_tools == 1
    assert host.terminals == []


@pytest.mark.rule("R-007")
async def test_an_authority_rejection_fails_the_turn() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), say("unreachable")],
        tools={"search_docs": raises(AuthorityRejected(["member"]))},
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "authority_rejected"
    assert len(host.snapshots) == 1


@pytest.mark.rule("R-040")
async def test_a_silent_model_stream_exhausts_the_inactivity_budget() -> None:
    host = FakeHost([[TextDelta("Hel"), Hang()]])
    outcome = await drive(host, budgets=Budgets(inactivity_ms=20))

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "inactivity_budget_exhausted"
    assert host.of("retry.scheduled") == []


@pytest.mark.rule("R-040")
async def test_inactivity_is_measured_on_the_injected_clock() -> None:
    host = FakeHost([[TextDelta("Hel"), Advance(121.0), TextDelta("lo"), finished()]])
    outcome = await drive(host)  # default budget: 120 s

    assert outcome.reason == "inactivity_budget_exhausted"
    assert host.of("answer.committed") == []
