"""The guardrail chain's result stage (R-070): one chain, checked again on the projection
before it is published. Pipeline-level, over in-memory ports."""

from __future__ import annotations

from typing import Any

import pytest

from kaizen_server_extension.policy.guardrails import (
    ALLOW,
    Deny,
    GuardrailCall,
    GuardrailChain,
    GuardrailResult,
    Redact,
    ResultVerdict,
    result_guardrail,
)
from kaizen_server_extension.protocol.tools import Capability, ToolOutcome, WriteCategory
from kaizen_server_extension.tools.types import RoomClass
from tests.policy.fakes import harness, make_tool, raising, returning

SECRET = "classified-4471"


def _withhold_secret(result: GuardrailResult) -> ResultVerdict:
    return Deny("it is classified", code="classified") if SECRET in result.content else ALLOW


def _mask_secret(result: GuardrailResult) -> ResultVerdict:
    if SECRET in result.content:
        return Redact(result.content.replace(SECRET, "[masked]"))
    return ALLOW


@pytest.mark.rule("R-070")
async def test_a_withheld_result_never_reaches_the_loop_but_the_tool_ran() -> None:
    h = harness(make_tool("lookup", returning({"note": f"the key is {SECRET}"})),
                guardrails=[result_guardrail(_withhold_secret)])
    result = await h.call("lookup")
    assert h.executed == ["lookup"]  # it ran
    assert SECRET not in result.content and "withheld by a safety check" in result.content
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert h.count("lookup", "read", "error") == 1.0
    # Audit keeps the raw result, marked as withheld.
    name, outcome, raw = h.audit.entries[-1]
    assert (name, outcome) == ("lookup", ToolOutcome.ERROR)
    assert isinstance(raw, dict) and raw["result_withheld"] == "classified"


@pytest.mark.rule("R-070")
async def test_a_redacting_result_check_replaces_the_published_text() -> None:
    h = harness(make_tool("lookup", returning(f"value {SECRET} here")),
                guardrails=[result_guardrail(_mask_secret)])
    result = await h.call("lookup")
    assert result.outcome is ToolOutcome.OK
    assert result.content == "value [masked] here"


async def test_one_guardrail_can_check_both_the_call_and_its_result() -> None:
    seen: list[str] = []

    class Both:
        def __call__(self, call: GuardrailCall) -> Any:
            seen.append("call")
            return ALLOW

        def check_result(self, result: GuardrailResult) -> ResultVerdict:
            seen.append("result")
            return _withhold_secret(result)

    h = harness(make_tool("lookup", returning(SECRET)), guardrails=[Both()])
    result = await h.call("lookup")
    assert seen == ["call", "result"] and SECRET not in result.content


@pytest.mark.rule("R-070")
@pytest.mark.parametrize("broken", [
    lambda result: 1 / 0,  # raises
    lambda result: "looks fine",  # not a verdict
    lambda result: Redact(None),  # type: ignore[arg-type]  # not a replacement text
])
async def test_a_broken_result_check_withholds_the_result(broken: Any) -> None:
    h = harness(make_tool("lookup", returning(SECRET)),
                guardrails=[result_guardrail(broken)])
    result = await h.call("lookup")
    assert SECRET not in result.content and result.outcome is ToolOutcome.ERROR


async def test_a_withheld_failed_write_keeps_its_outcome_and_still_closes_the_turn() -> None:
    write = make_tool("publish", raising(RuntimeError(f"host {SECRET} down")),
                      capability=Capability.WRITE, room_class=RoomClass.ACTOR_BOUND_WRITE,
                      write_category=WriteCategory.MEMBER_STORE)
    withheld_all = result_guardrail(lambda result: Deny("never shown", code="all"))
    h = harness(write, guardrails=[withheld_all])
    result = await h.call("publish")
    assert result.outcome is ToolOutcome.RAISED and result.closes_turn
    assert result.reference  # the operator reference survives the refusal
    assert "withheld by a safety check" in result.content


async def test_without_result_checks_the_stage_costs_nothing() -> None:
    chain = GuardrailChain([lambda call: ALLOW])
    assert not chain.checks_results
    assert GuardrailChain([result_guardrail(_withhold_secret)]).checks_results


def test_a_result_check_that_is_not_callable_is_refused_at_start_up() -> None:
    class Broken:
        check_result = "not callable"

        def __call__(self, call: GuardrailCall) -> Any:
            return ALLOW

    with pytest.raises(TypeError):
        GuardrailChain([Broken()])
