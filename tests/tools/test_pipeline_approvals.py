"""Approval mode, guardrails and one-shot receipts as the pipeline applies them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kaizen_server_extension.policy.approvals import (
    ApprovalMode,
    ApprovalStatus,
    arguments_digest,
)
from kaizen_server_extension.policy.errors import ApprovalPending
from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Deny,
    GuardrailCall,
    GuardrailVerdict,
    NeedsApproval,
)
from kaizen_server_extension.protocol.tools import Capability, ToolOutcome, WriteCategory
from kaizen_server_extension.tools.authorization import (
    AuthorizedBy,
    CallAuthorization,
    current_authorization,
)
from tests.policy.fakes import BUNDLE, Harness, harness, make_tool, raising, returning

EXTERNAL = dict(capability=Capability.WRITE, write_category=WriteCategory.EXTERNAL_EFFECT)
ARGS = '{"job": "train", "api_key": "sk-live-123"}'


def external_write(**extra: Any) -> Any:
    # First-party, as federated_write is: a source tool's credential-shaped arguments never
    # reach the approval gate (R-349, tests/credentials/test_broker_rest.py).
    return make_tool("federated_write", returning({"job_id": "j-1"}), **EXTERNAL,
                     **{"first_party": True, **extra})


async def ask(h: Harness, name: str = "federated_write", args: str = ARGS,
              step: int = 1) -> ApprovalPending:
    with pytest.raises(ApprovalPending) as pending:
        await h.call(name, args, step=step)
    return pending.value


@pytest.mark.rule("R-224", "R-440")
async def test_an_external_write_is_persisted_with_its_digest_before_any_wait():
    h = harness(external_write())
    pending = await ask(h)
    assert h.executed == []
    assert h.approvals is not None
    [record] = h.approvals.records
    assert record.approval_id == pending.approval_id
    assert record.digest == arguments_digest("federated_write", ARGS)
    assert record.redacted_args == {"job": "train", "api_key": "[REDACTED]"}
    # A pending approval is not a settled call: nothing is counted or audited yet.
    assert h.audit.entries == []
    assert h.count("federated_write", "write", "error") == 0


@pytest.mark.rule("R-241")
async def test_a_still_pending_receipt_is_refused_before_the_executor_is_entered():
    h = harness(external_write())
    await ask(h)
    result = await h.call("federated_write", ARGS)
    assert result.closes_turn and result.close_reason == "approval_pending"
    assert h.executed == []


@pytest.mark.rule("R-242")
async def test_a_missing_approval_store_fails_closed_for_a_call_that_needs_approval():
    h = harness(external_write(), make_tool("search", returning("hits")), approvals=False)
    result = await h.call("federated_write", ARGS)
    assert result.closes_turn and result.close_reason == "approval_unavailable"
    assert h.executed == []
    # A call that needs no approval is unaffected by the missing store.
    assert (await h.call("search")).outcome is ToolOutcome.OK


@pytest.mark.rule("R-242")
async def test_a_failing_approval_store_fails_closed():
    h = harness(external_write())

    async def broken(*args: object) -> None:
        raise ConnectionError("database is gone")

    assert h.approvals is not None
    h.approvals.find_receipt = broken  # type: ignore[method-assign]
    result = await h.call("federated_write", ARGS)
    assert result.close_reason == "approval_unavailable" and h.executed == []


@pytest.mark.rule("R-240")
async def test_an_approved_receipt_runs_the_call_once_and_a_replay_is_refused():
    h = harness(external_write())
    pending = await ask(h)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    assert (await h.call("federated_write", ARGS, step=2)).outcome is ToolOutcome.OK
    assert h.executed == ["federated_write"]
    # The receipt is spent: the same request asks again rather than running again.
    await ask(h, step=3)
    assert h.executed == ["federated_write"]


@pytest.mark.rule("R-240")
async def test_a_receipt_consumed_by_someone_else_is_refused():
    h = harness(external_write())
    pending = await ask(h)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)

    async def lost_race(run_id: str, approval_id: str) -> bool:
        return False  # another replica's compare-and-set won

    h.approvals.consume_receipt = lost_race  # type: ignore[method-assign]
    result = await h.call("federated_write", ARGS)
    assert result.closes_turn and result.close_reason == "approval_replayed"
    assert h.executed == []


@pytest.mark.rule("R-240")
async def test_the_guardrails_rerun_on_the_approved_call_and_can_still_deny():
    verdicts: list[GuardrailVerdict] = [ALLOW]

    def guard(call: GuardrailCall) -> GuardrailVerdict:
        return verdicts[-1]

    h = harness(external_write(), guardrails=[guard])
    pending = await ask(h)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    verdicts.append(Deny("Quota exhausted.", code="quota"))
    result = await h.call("federated_write", ARGS)
    assert result.closes_turn and result.close_reason == "quota"
    assert h.executed == []


@pytest.mark.rule("R-224", "R-283")
async def test_an_approval_covers_only_the_exact_argument_bytes():
    h = harness(external_write())
    pending = await ask(h)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    await ask(h, args='{"job": "train", "api_key": "sk-other"}')
    assert h.executed == []


async def test_a_declined_approval_is_an_error_the_turn_survives_and_nothing_runs():
    h = harness(external_write())
    pending = await ask(h)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.DENIED)
    result = await h.call("federated_write", ARGS)
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert h.executed == []


@pytest.mark.rule("R-286")
async def test_the_approved_call_after_a_confirmation_card_is_not_a_duplicate():
    created: list[int] = []

    async def create(arguments: Mapping[str, Any]) -> object:
        created.append(1)
        return {"artifact_id": "art-1"}

    h = harness(make_tool("create_artifact", create, capability=Capability.WRITE,
                          write_category=WriteCategory.MEMBER_STORE, repeat_creates_object=True),
                mode=ApprovalMode.ALWAYS_ASK)
    pending = await ask(h, "create_artifact", '{"title": "Q3"}', step=1)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    result = await h.call("create_artifact", '{"title": "Q3"}', step=2)
    assert result.outcome is ToolOutcome.OK and created == [1]


@pytest.mark.rule("R-438", "R-439")
@pytest.mark.parametrize("category", [WriteCategory.MEMBER_STORE,
                                      WriteCategory.ISOLATED_EXECUTION])
async def test_guarded_member_writes_run_without_a_card_under_ask_for_writes(category):
    h = harness(make_tool("manage_tasks", returning({"task_id": "t"}),
                          capability=Capability.WRITE, write_category=category))
    assert (await h.call("manage_tasks")).outcome is ToolOutcome.OK


async def test_always_ask_asks_for_a_member_store_write_but_not_for_a_read():
    h = harness(make_tool("manage_tasks", returning("ok"), capability=Capability.WRITE,
                          write_category=WriteCategory.MEMBER_STORE),
                make_tool("search", returning("hits")), mode=ApprovalMode.ALWAYS_ASK)
    await ask(h, "manage_tasks", "{}")
    assert (await h.call("search")).outcome is ToolOutcome.OK


@pytest.mark.rule("R-152")
async def test_never_ask_waives_the_gate_for_writes_but_a_sensitive_tool_still_confirms():
    h = harness(external_write(),
                make_tool("act_on_browser_page", returning("clicked"),
                          capability=Capability.SENSITIVE),
                mode=ApprovalMode.NEVER_ASK)
    assert (await h.call("federated_write", ARGS)).outcome is ToolOutcome.OK
    await ask(h, "act_on_browser_page", '{"click": "#buy"}')
    assert h.executed == ["federated_write"]


@pytest.mark.rule("R-237")
async def test_a_guardrail_asking_for_approval_holds_even_under_never_ask():
    h = harness(make_tool("search", returning("hits")), mode=ApprovalMode.NEVER_ASK,
                guardrails=[lambda call: NeedsApproval("operator review")])
    await ask(h, "search", "{}")
    assert h.executed == []


@pytest.mark.rule("R-261")
async def test_an_approved_undeclared_tool_that_raises_closes_the_turn():
    h = harness(make_tool("mystery", raising(RuntimeError("?")),
                          capability=Capability.UNDECLARED))
    pending = await ask(h, "mystery", "{}")
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    result = await h.call("mystery", "{}")
    assert result.outcome is ToolOutcome.RAISED and result.closes_turn


async def test_approvals_are_bound_to_the_run():
    h = harness(external_write())
    pending = await ask(h)
    assert h.approvals is not None
    h.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    h.approvals.records[0].run_id = "another-run"
    await ask(h)
    assert h.executed == [] and BUNDLE.run_id == "run-1"


def _recording(seen: list[CallAuthorization | None]) -> Any:
    async def impl(arguments: Mapping[str, Any]) -> object:
        seen.append(current_authorization())
        return {"ok": True}

    return impl


@pytest.mark.rule("R-377")
async def test_the_running_call_knows_what_authorized_it_one_shot_apart_from_never_ask():
    seen: list[CallAuthorization | None] = []
    tools = (make_tool("federated_write", _recording(seen), **EXTERNAL, first_party=True),
             make_tool("search", _recording(seen)))
    asking = harness(*tools)
    pending = await ask(asking)
    assert asking.approvals is not None
    asking.approvals.decide(pending.approval_id, ApprovalStatus.APPROVED)
    assert (await asking.call("federated_write", ARGS, step=2)).outcome is ToolOutcome.OK
    assert (await asking.call("search")).outcome is ToolOutcome.OK
    never = harness(*tools, mode=ApprovalMode.NEVER_ASK)
    assert (await never.call("federated_write", ARGS)).outcome is ToolOutcome.OK
    assert seen == [
        CallAuthorization(AuthorizedBy.ONE_SHOT_APPROVAL, "ask_for_writes",
                          pending.approval_id, BUNDLE.run_id),
        CallAuthorization(AuthorizedBy.NOT_REQUIRED, "ask_for_writes", None, BUNDLE.run_id),
        CallAuthorization(AuthorizedBy.NEVER_ASK, "never_ask", None, BUNDLE.run_id),
    ]
    # The fact belongs to the call's own task: nothing outside it sees one.
    assert current_authorization() is None
