"""The pipeline's credential steps on in-memory ports: a source tool's credential-shaped
arguments are refused before the approval gate and the executor; a first-party tool's are
not screened; a credential-backed tool without a credential port never runs."""

from __future__ import annotations

import json

import pytest

from kaizen_server_extension.protocol.tools import Capability, ToolOutcome, WriteCategory
from kaizen_server_extension.tools.ports import CREDENTIAL_DESTINATION_KEY
from tests.policy.fakes import harness, make_tool, returning

WRITE = dict(capability=Capability.WRITE, write_category=WriteCategory.EXTERNAL_EFFECT)


@pytest.mark.rule("R-349")
async def test_a_source_write_carrying_a_credential_is_refused_before_approval() -> None:
    h = harness(make_tool("mcp__crm__create", returning({"ok": True}), **WRITE))
    arguments = json.dumps({"name": "x", "auth": {"password": "hunter2-hunter2"}})
    result = await h.call("mcp__crm__create", arguments)
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert "credential-shaped at $.auth.password" in result.content
    assert "hunter2" not in result.content
    assert h.executed == []
    assert h.approvals is not None and h.approvals.records == []  # nobody was asked


async def test_a_first_party_tools_arguments_are_not_screened() -> None:
    h = harness(make_tool("run_code", returning({"ok": True}), first_party=True))
    result = await h.call("run_code", json.dumps({"code": "password = input()"}))
    assert result.outcome is ToolOutcome.OK and h.executed == ["run_code"]


@pytest.mark.rule("R-443")
async def test_a_credential_backed_tool_without_the_broker_never_runs() -> None:
    h = harness(make_tool("echo_whoami", returning({"ok": True}), first_party=True,
                          extra={CREDENTIAL_DESTINATION_KEY: "echo"}))
    result = await h.call("echo_whoami", json.dumps({"credential_ref": "cref_" + "a" * 30}))
    assert result.outcome is ToolOutcome.ERROR and "not available" in result.content
    assert h.executed == []
