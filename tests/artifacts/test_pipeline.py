"""create_artifact through the real guarded pipeline: duplicates suppressed before anything is
stored, and a create whose complete argument object is ambiguous never materializes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from kaizen_plugins import artifacts as plugin

from kaizen_server_extension.host.store_ports import StoreResourceAuthorization
from kaizen_server_extension.policy.approvals import ApprovalMode
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolOutcome
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.tools.pipeline import ToolPipeline
from kaizen_server_extension.tools.types import RegisteredTool
from tests.artifacts.support import Ctx, bundle_of, live_run, room
from tests.policy.fakes import Audit, FixedApprovalMode, FixedBundleAuthority, Permissions, Roster


async def _pipeline(store: Store) -> tuple[ToolPipeline, AuthorityBundle]:
    bundle = bundle_of(await live_run(store, await room(store)))
    services = {"artifacts": ArtifactStore(store)}

    async def execute(tool: RegisteredTool, run_bundle: AuthorityBundle,
                      arguments: Mapping[str, Any], /) -> object:
        return await tool.impl(Ctx(run_bundle, services), **arguments)

    tools = {t.descriptor.name: t for t in plugin.TOOLS}
    pipeline = ToolPipeline(
        tools=tools, ceiling=list(tools), authority=FixedBundleAuthority(bundle),
        permissions=Permissions(), approval_modes=FixedApprovalMode(ApprovalMode.NEVER_ASK),
        approvals=None, executor=execute, roster_is_only_initiator=Roster(), audit=Audit(),
        resources=StoreResourceAuthorization(store))
    return pipeline, bundle


@pytest.mark.rule("R-280", "R-282")
async def test_a_repeated_create_in_a_later_step_stores_nothing(store: Store) -> None:
    pipeline, bundle = await _pipeline(store)
    arguments = json.dumps({"title": "Q3", "kind": "markdown", "content": "# Q3\n"})
    first = await pipeline.run(bundle, ToolCallRequest("c1", "create_artifact", arguments, 1))
    again = await pipeline.run(bundle, ToolCallRequest("c2", "create_artifact", arguments, 2))
    assert first.outcome is ToolOutcome.OK
    assert again.outcome is ToolOutcome.SUPPRESSED
    artifact_id = json.loads(first.content)["artifact_id"]
    assert artifact_id in again.content
    stored = await ArtifactStore(store).list_for("alice")
    assert [r.artifact_id for r in stored] == [artifact_id]


@pytest.mark.rule("R-110", "R-447")
async def test_duplicate_keys_in_a_create_are_refused_and_nothing_is_stored(
        store: Store) -> None:
    pipeline, bundle = await _pipeline(store)
    # A later duplicate key would make the reserved language authoritative in a lax parser.
    arguments = ('{"title": "t", "kind": "code", "content": "{}", "language": "json", '
                 '"language": "renderable-artifact"}')
    result = await pipeline.run(bundle, ToolCallRequest("c1", "create_artifact", arguments, 1))
    assert result.outcome is ToolOutcome.ERROR and not result.closes_turn
    assert await ArtifactStore(store).list_for("alice") == []


@pytest.mark.rule("R-366")
async def test_store_refusals_are_definite_nothing_saved_errors(store: Store) -> None:
    pipeline, bundle = await _pipeline(store)
    created = await pipeline.run(bundle, ToolCallRequest(
        "c1", "create_artifact", json.dumps({"title": "a", "kind": "markdown",
                                             "content": "a"}), 1))
    artifact_id = json.loads(created.content)["artifact_id"]
    for step, expected in ((2, ToolOutcome.OK), (3, ToolOutcome.ERROR)):
        result = await pipeline.run(bundle, ToolCallRequest(
            f"u{step}", "update_artifact",
            json.dumps({"artifact_id": artifact_id, "content": f"v{step}",
                        "expected_version": 1}), step))
        assert result.outcome is expected
    assert "nothing was saved" in result.content.lower()
    assert not result.closes_turn  # not an ambiguous write: the turn goes on
