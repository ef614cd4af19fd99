"""The read_workspace / edit_workspace tools: declaration (write tier, explicit grant, one
protocol), the lease workspace of member + conversation, and trusted state selection."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kaizen_plugins import workspace as plugin
from kaizen_plugins.workspace import edit_workspace, read_workspace

from kaizen_hashline import HashlineError, WorkspaceState
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools import MemberSafeError, RoomClass, ToolRegistry, WriteCategory
from kaizen_server_extension.tools.catalog import freeze_catalog
from kaizen_server_extension.tools.schema import InvalidArguments, validate_arguments
from tests.support.services import tool_services


@dataclass
class Ctx:
    services: Mapping[str, Any] = field(default_factory=dict)
    member: str = "alice"
    conversation: str = "conv"

    def __post_init__(self) -> None:
        self.services = tool_services(self.services)  # type: ignore[assignment]

    @property
    def bundle(self) -> AuthorityBundle:
        return AuthorityBundle("run", self.conversation, 1, self.member, "agent-v1", 1,
                               "digest", 1)


@pytest.fixture
def service(tmp_path: Path) -> RunCodeService:
    return RunCodeService(RunCodeConfig(state_root=tmp_path / "state"))


@pytest.mark.rule("R-134", "R-169")
def test_both_tools_are_write_tier_isolated_execution_and_explicitly_granted():
    for registered in (read_workspace, edit_workspace):
        d = registered.descriptor
        assert d.capability is Capability.WRITE
        assert d.write_category is WriteCategory.ISOLATED_EXECUTION
        assert d.room_class is RoomClass.ACTOR_BOUND_WRITE
        assert d.explicit_grant_only and d.protocol_group == "workspace"
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    assert registry.owner("read_workspace") == registry.owner("edit_workspace") == \
        "kaizen_plugins.workspace"
    # An agent without a tool list (e.g. a read-only/search agent) never gets them.
    catalog = freeze_catalog(registry.descriptors(), agent_ceiling=None, room_shared=False,
                             roster_is_only_initiator=True, discovery_enabled=False)
    assert "read_workspace" not in catalog and "edit_workspace" not in catalog
    granted = freeze_catalog(registry.descriptors(),
                             agent_ceiling={"run_code", "read_workspace", "edit_workspace"},
                             room_shared=False, roster_is_only_initiator=True,
                             discovery_enabled=False)
    assert "read_workspace" in granted and "edit_workspace" in granted


def test_schemas_are_closed():
    args = validate_arguments(read_workspace.descriptor, json.dumps({"path": "a.py"}))
    assert args == {"path": "a.py"}
    with pytest.raises(InvalidArguments):
        validate_arguments(read_workspace.descriptor, json.dumps({"path": "a", "tag": "x"}))
    with pytest.raises(InvalidArguments):
        validate_arguments(edit_workspace.descriptor, json.dumps({}))
    with pytest.raises(InvalidArguments):
        validate_arguments(read_workspace.descriptor, json.dumps({"path": "a", "limit": 401}))


@pytest.mark.rule("R-153")
async def test_tools_use_the_run_code_lease_workspace_of_member_and_conversation(
        service: RunCodeService):
    state = WorkspaceState()
    ctx = Ctx({"run_code": service, "workspace_state": state})
    root = service.workspace("alice", "conv")
    (root / "app.py").write_text("x = 1\n")
    view = await read_workspace.impl(ctx, path="app.py")
    assert view["text"].startswith(f"[app.py#{view['tag']}]\n1:x = 1")
    result = await edit_workspace.impl(ctx, edits=f"[app.py#{view['tag']}]\nPUT 1.=1:\n+x = 2\n")
    assert (root / "app.py").read_text() == "x = 2\n"
    assert result["sections"][0]["header"].startswith("[app.py#")
    assert "+x = 2" in result["diff"]
    # Another member, or the same member in another conversation, has another workspace.
    for other in (Ctx({"run_code": service, "workspace_state": state}, member="bob"),
                  Ctx({"run_code": service, "workspace_state": state}, conversation="c2")):
        with pytest.raises(HashlineError) as err:
            await read_workspace.impl(other, path="app.py")
        assert err.value.code == "not_found"


async def test_state_survives_lease_release_and_defaults_to_the_module_store(
        service: RunCodeService):
    ctx = Ctx({"run_code": service})  # no workspace_state service: the module default
    root = service.workspace("alice", "conv")
    (root / "m.py").write_text("a = 1\nb = 2\n")
    tag = (await read_workspace.impl(ctx, path="m.py"))["tag"]
    await edit_workspace.impl(ctx, edits=f"[m.py#{tag}]\nCUT 2.=2 @b\n")
    await service.release("alice", "conv")  # the lease goes; trusted state stays
    tag = (await read_workspace.impl(ctx, path="m.py"))["tag"]
    await edit_workspace.impl(ctx, edits=f"[m.py#{tag}]\nPUT <1 @b\n")
    assert (service.workspace("alice", "conv") / "m.py").read_text() == "b = 2\na = 1\n"
    assert plugin.DEFAULT_STATE.registers(plugin.WorkspaceKey("alice", "conv")) == {
        "b": ("b = 2",)}
    plugin.DEFAULT_STATE.forget(plugin.WorkspaceKey("alice", "conv"))


async def test_without_the_kernel_service_the_tools_fail_member_safely():
    with pytest.raises(MemberSafeError) as err:
        await read_workspace.impl(Ctx(), path="a")
    assert err.value.code == "workspace_unavailable"


async def test_errors_are_member_safe_with_caller_domain(service: RunCodeService):
    ctx = Ctx({"run_code": service, "workspace_state": WorkspaceState()})
    with pytest.raises(MemberSafeError) as err:
        await edit_workspace.impl(ctx, edits="[../x#0000]\nREM\n")
    assert (err.value.code, err.value.domain) == ("path_refused", "caller")
