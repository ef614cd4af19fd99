"""The approval gate and "allow for this conversation", over in-memory ports.

A grant arrives only as part of the call's facts (read when the call was journaled); it stands
in for the member's own decision on a write tool, and for nothing else: not for an operator
guardrail's demand, not for a sensitive tool, not past a denying guardrail or a revoked
permission, not for another member's facts, and not on a re-run whose facts were read afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from kaizen_server_extension.policy.approvals import ApprovalMode, ApprovalStatus, grantable
from kaizen_server_extension.policy.errors import ApprovalPending
from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Deny,
    GuardrailCall,
    GuardrailVerdict,
    NeedsApproval,
)
from kaizen_server_extension.protocol.authority import AuthorityBundle, verify_bundle
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.store import models as m
from kaizen_server_extension.tools.authorization import AuthorizedBy, CallAuthorization, GrantRef
from kaizen_server_extension.tools.ports import CallFactsView, CallScope
from tests.policy.fakes import BUNDLE, Harness, harness, make_tool, returning

TOOL = "save_note"


@dataclass(frozen=True)
class Facts:
    member: str = BUNDLE.member
    approval_mode: str = ApprovalMode.ALWAYS_ASK.value
    only_initiator: bool = True
    grants: Mapping[str, bool] = field(default_factory=lambda: {TOOL: True})
    # The approval that made the grants (None: that approval row is gone).
    made_by: str | None = "ap_grant"

    def allowed(self, tool: str) -> bool | None:
        return None

    def granted(self, tool: str) -> bool | None:
        return self.grants.get(tool)

    def grant_approval(self, tool: str) -> str | None:
        return self.made_by if self.grants.get(tool) else None


@dataclass
class PrefetchedAuthority:
    """Checks the bundle and hands back the call's prefetched facts, as the store does."""

    admitted: AuthorityBundle

    async def verify(self, bundle: AuthorityBundle,
                     prefetched: CallFactsView | None = None) -> CallFactsView | None:
        verify_bundle(self.admitted, bundle)
        return prefetched


def gated(capability: Capability = Capability.WRITE,
          category: WriteCategory = WriteCategory.MEMBER_STORE,
          guardrails: list[object] | None = None) -> Harness:
    return harness(make_tool(TOOL, returning({"saved": True}), capability=capability,
                             write_category=category),
                   mode=ApprovalMode.ALWAYS_ASK, authority=PrefetchedAuthority(BUNDLE),
                   guardrails=guardrails)  # type: ignore[arg-type]


async def call(h: Harness, facts: CallFactsView | None, name: str = TOOL) -> ToolCallResult:
    request = ToolCallRequest(f"call-{name}-{id(facts)}", name, '{"text": "hi"}', 1)
    return await h.pipeline.run(BUNDLE, request, CallScope(facts=facts))


def test_only_a_write_is_grantable_and_the_database_agrees() -> None:
    assert [c for c in Capability if grantable(c)] == [Capability.WRITE]
    assert m.GRANTABLE_CAPABILITY == Capability.WRITE.value


@pytest.mark.rule("R-223", "R-377")
@pytest.mark.parametrize("made_by", ["ap_grant", None])
async def test_the_calls_grant_answers_the_members_own_approval(made_by: str | None) -> None:
    h = gated()
    result = await call(h, Facts(made_by=made_by))
    assert result.outcome is ToolOutcome.OK and h.executed == [TOOL]
    assert h.approvals is not None and h.approvals.records == []
    # The raw result is the tool's own; the audit names the grant that answered the gate.
    [(_, _, raw)] = h.audit.entries
    assert raw == {"saved": True}
    assert h.audit.authorizations == [CallAuthorization(
        AuthorizedBy.CONVERSATION_GRANT, "always_ask", run_id=BUNDLE.run_id,
        grant=GrantRef(BUNDLE.conversation_id, TOOL, made_by))]


@pytest.mark.rule("R-224")
@pytest.mark.parametrize("facts", [
    None,  # a re-run after an approval, or a check with no journaled facts
    Facts(grants={}),  # the grant was not there (or was revoked) when the call was journaled
    Facts(grants={"other_tool": True}),  # another tool's grant
    Facts(member="bob"),  # facts that are not the run member's never answer for them
], ids=["no-facts", "no-grant", "other-tool", "other-member"])
async def test_without_the_calls_own_grant_the_member_is_asked(
        facts: CallFactsView | None) -> None:
    h = gated()
    with pytest.raises(ApprovalPending):
        await call(h, facts)
    assert h.executed == []


@pytest.mark.rule("R-240")
async def test_a_rerun_after_approval_consumes_its_receipt_though_a_grant_exists() -> None:
    h = gated()
    with pytest.raises(ApprovalPending) as pending:
        await call(h, None)
    assert h.approvals is not None
    h.approvals.decide(pending.value.approval_id, ApprovalStatus.APPROVED)
    # The host re-runs the call with fresh facts, which carry no grant: the receipt is used.
    result = await call(h, None)
    assert result.outcome is ToolOutcome.OK
    assert h.approvals.records[0].status is ApprovalStatus.CONSUMED


@pytest.mark.rule("R-152")
@pytest.mark.parametrize("capability", [Capability.SENSITIVE, Capability.UNDECLARED])
async def test_a_grant_never_answers_for_a_tool_that_confirms_every_call(
        capability: Capability) -> None:
    h = gated(capability=capability, category=WriteCategory.EXTERNAL_EFFECT)
    with pytest.raises(ApprovalPending):
        await call(h, Facts())
    assert h.executed == []


def _demand(call: GuardrailCall) -> GuardrailVerdict:
    return NeedsApproval("the operator reviews this")


def _deny(call: GuardrailCall) -> GuardrailVerdict:
    return Deny("Not on this server.", code="blocked_here")


def _allow(call: GuardrailCall) -> GuardrailVerdict:
    return ALLOW


@pytest.mark.rule("R-237")
async def test_an_operator_guardrails_demand_still_asks() -> None:
    h = gated(guardrails=[_demand])
    with pytest.raises(ApprovalPending):
        await call(h, Facts())
    assert h.executed == []


@pytest.mark.rule("R-237", "R-223")
async def test_a_denying_guardrail_refuses_though_the_tool_is_granted() -> None:
    h = gated(guardrails=[_allow, _deny])
    result = await call(h, Facts())
    assert result.outcome is ToolOutcome.ERROR and result.close_reason == "blocked_here"
    assert h.executed == []


@pytest.mark.rule("R-204")
async def test_a_revoked_permission_refuses_though_the_tool_is_granted() -> None:
    h = gated()
    h.permissions.revoked.add(TOOL)
    result = await call(h, Facts())
    assert result.close_reason == "permission_denied" and h.executed == []
