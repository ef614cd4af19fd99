"""A task's posture at the pipeline: a safe test performs no effect outside the sandbox, and a
task run's every effect re-reads the task's authority, failing closed when it is gone."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kaizen_server_extension.policy.approvals import ApprovalMode
from kaizen_server_extension.policy.task_posture import TaskPostureGate
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import Capability, ToolOutcome, WriteCategory
from tests.policy.fakes import BUNDLE, FixedBundleAuthority, Harness, harness, make_tool, returning

TEST_RUN = dataclasses.replace(BUNDLE, posture="task_test")
TASK_RUN = dataclasses.replace(BUNDLE, posture="task_run")
WRITE = dict(capability=Capability.WRITE, write_category=WriteCategory.MEMBER_STORE)
EXTERNAL = dict(capability=Capability.WRITE, write_category=WriteCategory.EXTERNAL_EFFECT)
SANDBOX = dict(capability=Capability.WRITE, write_category=WriteCategory.ISOLATED_EXECUTION)


class Authority:
    """The task's authority as the store would answer it now; counts every look."""

    def __init__(self, present: bool = True) -> None:
        self.present = present
        self.looks: list[tuple[str, str]] = []

    async def current_authority(self, run_id: str, member: str) -> object | None:
        self.looks.append((run_id, member))
        return object() if self.present else None


def gated(bundle: AuthorityBundle, lookup: Any, mode: ApprovalMode = ApprovalMode.NEVER_ASK,
          ) -> Harness:
    """The pipeline of a run admitted with ``bundle`` (its posture included)."""
    gate = TaskPostureGate(lookup) if lookup is not None else None
    return harness(*tools(), mode=mode, authority=FixedBundleAuthority(bundle),
                   task_posture=gate)


def tools() -> list[Any]:
    return [make_tool("search", returning({"hits": [1]})),
            make_tool("save_note", returning({"saved": True}), **WRITE),
            make_tool("send_mail", returning({"sent": True}), **EXTERNAL),
            make_tool("undeclared", returning("did something"), capability=Capability.UNDECLARED),
            make_tool("run_code", returning({"stdout": "4"}), **SANDBOX)]


@pytest.mark.rule("R-053", "R-055")
@pytest.mark.parametrize("name", ["save_note", "send_mail", "undeclared"])
async def test_a_safe_test_refuses_every_effect_outside_the_sandbox_before_asking(name: str):
    authority = Authority()
    # always_ask: a refusal must come before any approval is even requested.
    h = gated(TEST_RUN, authority, ApprovalMode.ALWAYS_ASK)
    result = await h.call(name, bundle=TEST_RUN)
    assert result.outcome is ToolOutcome.ERROR
    assert "safe test" in result.content and f"{name} was not run" in result.content
    assert not result.closes_turn  # the test goes on and reports what it would have done
    assert h.executed == []
    assert h.approvals is not None and h.approvals.records == []


@pytest.mark.rule("R-055")
async def test_a_safe_test_reads_and_runs_code_in_its_sandbox():
    h = gated(TEST_RUN, Authority())
    assert (await h.call("search", bundle=TEST_RUN)).outcome is ToolOutcome.OK
    assert (await h.call("run_code", bundle=TEST_RUN)).outcome is ToolOutcome.OK
    assert h.executed == ["search", "run_code"]


@pytest.mark.rule("R-056", "R-057")
async def test_a_task_run_rereads_its_authority_for_every_effect_and_blocks_without_it():
    authority = Authority()
    h = gated(TASK_RUN, authority)
    assert (await h.call("save_note", bundle=TASK_RUN)).outcome is ToolOutcome.OK
    # Read before the gate and again immediately before execution.
    assert authority.looks == [("run-1", "alice"), ("run-1", "alice")]
    assert (await h.call("search", bundle=TASK_RUN)).outcome is ToolOutcome.OK
    assert len(authority.looks) == 2  # a read needs no task authority

    authority.present = False  # the task was deleted or edited, or its owner left the room
    blocked = await h.call("save_note", '{"again": 1}', bundle=TASK_RUN)
    assert blocked.closes_turn and blocked.close_reason == "task_authority_missing"
    assert h.executed == ["save_note", "search"]


@pytest.mark.rule("R-057")
async def test_task_authority_that_cannot_be_read_or_checked_fails_closed():
    class Broken:
        async def current_authority(self, run_id: str, member: str) -> object | None:
            raise RuntimeError("database unavailable")

    h = gated(TASK_RUN, Broken())
    result = await h.call("save_note", bundle=TASK_RUN)
    assert result.closes_turn and result.close_reason == "task_authority_missing"
    # A pipeline with no way to check task authority never runs a task's effect.
    bare = gated(TASK_RUN, None)
    result = await bare.call("save_note", bundle=TASK_RUN)
    assert result.close_reason == "task_authority_unavailable"
    assert h.executed == [] and bare.executed == []


@pytest.mark.rule("R-053")
async def test_a_posture_the_server_does_not_know_is_blocked():
    odd = dataclasses.replace(BUNDLE, posture="task_anything")
    h = gated(odd, Authority())
    result = await h.call("save_note", bundle=odd)
    assert result.closes_turn and result.close_reason == "task_posture_unknown"
    assert h.executed == []
