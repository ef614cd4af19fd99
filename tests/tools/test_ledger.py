"""The turn ledger on its own: what it remembers, and what it forgets."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.tools import (
    Capability,
    FailureDomain,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.tools.ledger import DEFAULT_HEALTH_LIMIT, TurnLedger
from kaizen_server_extension.tools.types import ToolDescriptor

CREATE = ToolDescriptor("create_artifact", "", {}, Capability.WRITE, repeat_creates_object=True)
RUN = ToolDescriptor("run_code", "", {}, Capability.WRITE)


def req(args: str = "{}", step: int = 1, name: str = "create_artifact") -> ToolCallRequest:
    return ToolCallRequest(f"c-{name}-{args}-{step}", name, args, step)


def res(outcome: ToolOutcome = ToolOutcome.OK, domain: FailureDomain = FailureDomain.NONE,
        content: str = '{"artifact_id": "a1"}', name: str = "create_artifact") -> ToolCallResult:
    return ToolCallResult("c", name, outcome, content, failure_domain=domain)


@pytest.mark.rule("R-279", "R-287")
def test_only_a_success_from_an_earlier_step_suppresses():
    ledger = TurnLedger()
    ledger.record(CREATE, req(step=1), res())
    assert ledger.check(CREATE, req(step=1)) is None
    decision = ledger.check(CREATE, req(step=2))
    assert decision is not None and decision.outcome is ToolOutcome.SUPPRESSED
    assert '"a1"' in decision.content


@pytest.mark.rule("R-285")
@pytest.mark.parametrize("outcome", [ToolOutcome.ERROR, ToolOutcome.TIMEOUT, ToolOutcome.RAISED])
def test_a_failed_write_is_never_remembered_as_created(outcome: ToolOutcome):
    ledger = TurnLedger()
    ledger.record(CREATE, req(step=1), res(outcome, FailureDomain.TOOL))
    ledger.record(RUN, req(name="run_code", step=2), res(name="run_code"))
    assert ledger.check(CREATE, req(step=3)) is None


@pytest.mark.rule("R-270")
def test_the_same_failing_request_counts_once_towards_health():
    ledger = TurnLedger()
    for step in range(DEFAULT_HEALTH_LIMIT + 2):
        ledger.record(RUN, req('{"same": 1}', step, "run_code"),
                      res(ToolOutcome.ERROR, FailureDomain.TOOL, name="run_code"))
    assert not ledger.is_cut_off("run_code")


@pytest.mark.rule("R-271")
def test_caller_failures_never_count_towards_health():
    ledger = TurnLedger(health_limit=1)
    ledger.record(RUN, req('{"n": 1}', 1, "run_code"),
                  res(ToolOutcome.ERROR, FailureDomain.CALLER, name="run_code"))
    assert not ledger.is_cut_off("run_code")


@pytest.mark.rule("R-273")
def test_an_identical_failure_is_refused_until_something_succeeds():
    ledger = TurnLedger()
    ledger.record(RUN, req("{}", 1, "run_code"),
                  res(ToolOutcome.ERROR, FailureDomain.CALLER, name="run_code"))
    refused = ledger.check(RUN, req("{}", 2, "run_code"))
    assert refused is not None and refused.reason_code == "identical_failure_refused"
    ledger.record(CREATE, req(step=2), res())  # the world may have changed
    assert ledger.check(RUN, req("{}", 3, "run_code")) is None


@pytest.mark.rule("R-290")
def test_refusal_wording_escalates_after_the_coaching_ones():
    ledger = TurnLedger(coaching_refusals=2)
    ledger.record(RUN, req("{}", 1, "run_code"),
                  res(ToolOutcome.ERROR, FailureDomain.TOOL, name="run_code"))
    decisions = [ledger.check(RUN, req("{}", n, "run_code")) for n in range(2, 6)]
    assert [d.escalated for d in decisions if d] == [False, False, True, True]
    assert all(d is not None and "Stop calling run_code" in d.content for d in decisions[2:])
