"""Hashline's trusted state in the database (R-159): a tag read through one service instance
edits through a fresh one after the lease was released, named registers come along, and each
path keeps at most four versions — a bound the database itself enforces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kaizen_plugins.workspace import edit_workspace, read_workspace
from sqlalchemy.exc import IntegrityError

from kaizen_hashline import HashlineError, WorkspaceKey, WorkspaceState
from kaizen_kernel.service import RunCodeConfig, RunCodeService
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.hashline_state import StoredWorkspaceState
from tests.artifacts.support import room
from tests.support.services import tool_services


@dataclass
class Ctx:
    conversation: str
    services: Mapping[str, Any] = field(default_factory=dict)
    member: str = "alice"

    def __post_init__(self) -> None:
        self.services = tool_services(self.services)  # type: ignore[assignment]

    @property
    def bundle(self) -> AuthorityBundle:
        return AuthorityBundle("run", self.conversation, 1, self.member, "agent-v1", 1,
                               "digest", 1)


def _replica(tmp_path: Path, store: Store, conversation: str) -> Ctx:
    """One server replica: its own kernel service and its own state service instance, over
    the shared database (and the workspace volume both replicas mount)."""
    service = RunCodeService(RunCodeConfig(state_root=tmp_path / "state"))
    return Ctx(conversation, {"run_code": service,
                              "workspace_store": StoredWorkspaceState(store)})


@pytest.mark.rule("R-159")
async def test_a_tag_and_a_register_survive_release_and_a_replica_change(
        store: Store, tmp_path: Path) -> None:
    conversation = await room(store)
    first = _replica(tmp_path, store, conversation)
    service = first.services.run_code
    (service.workspace("alice", conversation) / "m.py").write_text("a = 1\nb = 2\n")
    tag = (await read_workspace.impl(first, path="m.py"))["tag"]
    cut = await edit_workspace.impl(first, edits=f"[m.py#{tag}]\nCUT 2.=2 @b\n")
    tag = cut["sections"][0]["header"].split("#")[1].rstrip("]")
    await service.release("alice", conversation)  # the worker's lease is gone

    # The same tag, from a fresh replica that never saw the read: the edit lands and the
    # register cut on the first replica pastes.
    second = _replica(tmp_path, store, conversation)
    await edit_workspace.impl(second, edits=f"[m.py#{tag}]\nPUT <1 @b\n")
    workspace = second.services.run_code.workspace("alice", conversation)
    assert (workspace / "m.py").read_text() == "b = 2\na = 1\n"

    # Without the durable state (a process-local one) the same kind of tag is unknown.
    (workspace / "n.py").write_text("x = 1\n")
    n_tag = (await read_workspace.impl(second, path="n.py"))["tag"]
    local = Ctx(conversation, {"run_code": second.services.run_code,
                               "workspace_state": WorkspaceState()})
    with pytest.raises(HashlineError):
        await edit_workspace.impl(local, edits=f"[n.py#{n_tag}]\nPUT 1.=1:\n+x = 2\n")
    assert (workspace / "n.py").read_text() == "x = 1\n"


@pytest.mark.rule("R-159")
async def test_each_path_retains_at_most_four_versions(store: Store, tmp_path: Path) -> None:
    conversation = await room(store)
    ctx = _replica(tmp_path, store, conversation)
    stored: StoredWorkspaceState = ctx.services.workspace_store
    workspace = ctx.services.run_code.workspace("alice", conversation)
    (workspace / "f.txt").write_text("v0\n")
    tags = [(await read_workspace.impl(ctx, path="f.txt"))["tag"]]
    for n in range(1, 7):
        result = await edit_workspace.impl(
            _replica(tmp_path, store, conversation),
            edits=f"[f.txt#{tags[-1]}]\nPUT 1.=1:\n+v{n}\n")
        tags.append(result["sections"][0]["header"].split("#")[1].rstrip("]"))
        key = WorkspaceKey("alice", conversation)
        assert await stored.retained(key, "f.txt") == min(n + 1, 4)
    assert (workspace / "f.txt").read_text() == "v6\n"
    # The oldest versions were pruned: a tag of v1 no longer resolves, from any replica.
    with pytest.raises(HashlineError):
        await edit_workspace.impl(_replica(tmp_path, store, conversation),
                                  edits=f"[f.txt#{tags[1]}]\nPUT 1.=1:\n+late\n")
    assert (workspace / "f.txt").read_text() == "v6\n"


async def test_the_database_refuses_a_fifth_version_slot(store: Store) -> None:
    conversation = await room(store)
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            tx.session.add(m.HashlineVersion(
                actor="alice", conversation_id=conversation, path="f.txt", slot=4,
                tag="ABCD", text="x\n", seen=[1], touched=1))
            await tx.session.flush()
