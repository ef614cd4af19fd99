"""Execution bounds and cancellation: a tool is stopped, a cancelled turn is never settled."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from kaizen_server_extension.protocol.errors import RunCancelled
from kaizen_server_extension.protocol.tools import (
    Capability,
    FailureDomain,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.tools.types import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, ToolDescriptor
from tests.policy.fakes import harness, make_tool


class Sleeper:
    """A tool that blocks until cancelled, and remembers that it was."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def __call__(self, arguments: Mapping[str, Any]) -> object:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "never"


@pytest.mark.rule("R-291", "R-294")
async def test_a_read_outrunning_its_bound_is_cancelled_and_reported_as_a_tool_failure():
    sleeper = Sleeper()
    h = harness(make_tool("search", sleeper, timeout_s=0.05))
    result = await h.call("search")
    assert sleeper.cancelled
    assert result.outcome is ToolOutcome.TIMEOUT and not result.closes_turn
    assert result.failure_domain is FailureDomain.TOOL  # a tool failure, not a policy denial
    assert result.close_reason is None
    assert h.count("search", "read", "timeout") == 1


@pytest.mark.rule("R-441")
async def test_a_write_that_times_out_is_an_ambiguous_write_and_closes_the_turn():
    sleeper = Sleeper()
    h = harness(make_tool("manage_tasks", sleeper, timeout_s=0.05, capability=Capability.WRITE,
                          write_category=WriteCategory.MEMBER_STORE))
    result = await h.call("manage_tasks")
    assert sleeper.cancelled
    assert result.outcome is ToolOutcome.TIMEOUT
    assert result.closes_turn and result.close_reason == "ambiguous_write"


@pytest.mark.rule("R-292", "R-266")
def test_an_undeclared_bound_gets_the_default_and_a_declared_bound_is_capped():
    base = dict(name="t", description="", input_schema={})
    assert ToolDescriptor(**base, timeout_s=0).effective_timeout_s == DEFAULT_TIMEOUT_S
    assert ToolDescriptor(**base, timeout_s=10_000).effective_timeout_s == MAX_TIMEOUT_S == 240


@pytest.mark.rule("R-262", "R-293")
async def test_cancelling_the_turn_cancels_the_tool_and_settles_nothing():
    sleeper = Sleeper()
    h = harness(make_tool("search", sleeper))
    call = asyncio.ensure_future(h.call("search"))
    await sleeper.started.wait()
    call.cancel()
    with pytest.raises(RunCancelled):
        await call
    assert sleeper.cancelled
    # Counted as abandoned for the dashboard, but no settled result exists to hand back.
    assert h.count("search", "read", "abandoned") == 1
    assert [outcome for _, outcome, _ in h.audit.entries] == [ToolOutcome.ABANDONED]
    assert not h.pipeline.ledger.is_cut_off("search")


@pytest.mark.rule("R-262", "R-293")
async def test_the_turn_cancel_signal_stops_a_running_write_without_settling_it():
    sleeper = Sleeper()
    h = harness(make_tool("run_code", sleeper, capability=Capability.WRITE,
                          write_category=WriteCategory.ISOLATED_EXECUTION))
    call = asyncio.ensure_future(h.call("run_code"))
    await sleeper.started.wait()
    h.cancelled.set()
    with pytest.raises(RunCancelled):
        await call
    assert sleeper.cancelled
    assert h.count("run_code", "write", "abandoned") == 1


@pytest.mark.rule("R-262")
async def test_a_call_arriving_after_the_turn_was_cancelled_never_runs():
    ran: list[int] = []

    async def impl(arguments: Mapping[str, Any]) -> object:
        ran.append(1)
        return "ran"

    h = harness(make_tool("search", impl))
    h.cancelled.set()
    with pytest.raises(RunCancelled):
        await h.call("search")
    assert ran == [] and h.audit.entries == []


@pytest.mark.rule("R-262")
async def test_a_cancellation_during_the_policy_checks_is_not_settled_either():
    h = harness(make_tool("search", Sleeper()))
    gate = asyncio.Event()

    async def slow_permissions(member: str, tool_name: str, facts: object = None) -> bool:
        gate.set()
        await asyncio.sleep(3600)
        return True

    h.permissions.allowed = slow_permissions  # type: ignore[method-assign]
    call = asyncio.ensure_future(h.call("search"))
    await gate.wait()
    call.cancel()
    with pytest.raises(RunCancelled):
        await call
    assert h.executed == [] and h.audit.entries == []
