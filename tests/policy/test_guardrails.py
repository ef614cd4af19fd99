"""The guardrail chain and the capability ceiling."""

from __future__ import annotations

import pytest

from kaizen_server_extension.policy.approvals import ApprovalMode
from kaizen_server_extension.policy.ceilings import CapabilityCeiling
from kaizen_server_extension.policy.errors import PolicyDenied
from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Allow,
    Deny,
    GuardrailCall,
    GuardrailChain,
    GuardrailVerdict,
    NeedsApproval,
)
from kaizen_server_extension.protocol.tools import ToolCallRequest
from kaizen_server_extension.tools.types import ToolDescriptor
from tests.policy.fakes import BUNDLE

CALL = GuardrailCall(BUNDLE, ToolCallRequest("c1", "t", "{}", 1),
                     ToolDescriptor("t", "", {}), {}, ApprovalMode.ASK_FOR_WRITES)


def const(verdict: GuardrailVerdict, seen: list[str] | None = None, tag: str = ""):
    def guard(call: GuardrailCall) -> GuardrailVerdict:
        if seen is not None:
            seen.append(tag)
        return verdict
    return guard


async def test_an_empty_chain_allows():
    assert await GuardrailChain().evaluate(CALL) == ALLOW


@pytest.mark.rule("R-237")
async def test_the_first_deny_stops_the_chain_in_registration_order():
    seen: list[str] = []
    chain = GuardrailChain([const(ALLOW, seen, "a"), const(Deny("no", "x"), seen, "b"),
                            const(Deny("later", "y"), seen, "c")])
    assert await chain.evaluate(CALL) == Deny("no", "x")
    assert seen == ["a", "b"]


async def test_needs_approval_is_kept_but_a_later_deny_still_wins():
    chain = GuardrailChain([const(NeedsApproval("review")), const(ALLOW)])
    assert await chain.evaluate(CALL) == NeedsApproval("review")
    chain = GuardrailChain([const(NeedsApproval("review")), const(Deny("no"))])
    assert isinstance(await chain.evaluate(CALL), Deny)


async def test_async_guardrails_are_awaited():
    async def guard(call: GuardrailCall) -> GuardrailVerdict:
        return Deny("async no")

    assert await GuardrailChain([guard]).evaluate(CALL) == Deny("async no")


@pytest.mark.parametrize("broken", [
    lambda call: 1 / 0,
    lambda call: "allow",  # not a verdict
    lambda call: None,
])
async def test_a_broken_guardrail_fails_closed(broken):
    verdict = await GuardrailChain([broken, const(ALLOW)]).evaluate(CALL)
    assert isinstance(verdict, Deny) and verdict.code == "guardrail_error"


def test_a_registered_guardrail_that_is_not_callable_is_refused_at_start_up():
    with pytest.raises(TypeError):
        GuardrailChain.from_registrations([("plugin", "not a guardrail")])
    chain = GuardrailChain.from_registrations([("plugin", const(Allow()))])
    assert len(chain) == 1


@pytest.mark.rule("R-001", "R-097")
def test_the_ceiling_refuses_a_tool_outside_it():
    ceiling = CapabilityCeiling.of(["inspect_tasks"])
    ceiling.check("inspect_tasks")
    with pytest.raises(PolicyDenied) as denied:
        ceiling.check("manage_tasks")
    assert denied.value.code == "over_ceiling"
    assert "manage_tasks" not in denied.value.member_message
