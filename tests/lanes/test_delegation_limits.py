"""The delegation bounds hold in the host itself, before any agent is looked up: a call past
the depth (a kernel or plugin reaching invoke_agent some other way included) or past the
run's delegation count is refused with a typed error (R-060)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kaizen_server_extension.host import delegation
from kaizen_server_extension.host.delegation import DelegationLimits, RunDelegation
from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.runtime.port import Budgets


class _NoAgents:
    """A store whose agent lookup must never be reached."""

    @property
    def agents(self) -> Any:
        raise AssertionError("the bound is checked before any agent is looked up")


def _delegation(limits: DelegationLimits, calls_made: int = 0) -> RunDelegation:
    unused = cast(Any, None)
    return RunDelegation(store=cast(Any, _NoAgents()), lane=unused, lease=unused,
                         bundle=unused, tools=unused, backend=unused, model_stream=unused,
                         cancelled=asyncio.Event(), budgets=Budgets(), correction_rules=(),
                         limits=limits, calls_made=calls_made)


def _refusal(runner: RunDelegation) -> MemberSafeError:
    with pytest.raises(MemberSafeError) as refused:
        asyncio.run(runner.invoke("search", "a task"))
    return refused.value


@pytest.mark.rule("R-060")
def test_a_call_at_the_maximum_depth_is_refused() -> None:
    async def at_depth(depth: int) -> None:
        token = delegation._DEPTH.set(depth)
        try:
            await _delegation(DelegationLimits(max_depth=2)).invoke("search", "a task")
        finally:
            delegation._DEPTH.reset(token)

    with pytest.raises(MemberSafeError) as refused:
        asyncio.run(at_depth(2))
    assert refused.value.code == "delegation_depth_exceeded"


@pytest.mark.rule("R-060")
def test_depth_zero_turns_delegation_off() -> None:
    assert _refusal(_delegation(DelegationLimits(max_depth=0))).code == \
        "delegation_depth_exceeded"


@pytest.mark.rule("R-060")
def test_a_resumed_run_keeps_counting_its_delegations() -> None:
    refused = _refusal(_delegation(DelegationLimits(max_calls=4), calls_made=4))
    assert refused.code == "delegation_limit_reached"
