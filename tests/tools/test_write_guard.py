"""The write guard and the tool's own resource authorization, through the real store-backed
pipeline (PipelineToolBackend.caller) on SQLite and PostgreSQL.

The step runs after the approval gate and immediately before execution (R-223): every call
that may have an effect re-checks the run and the member's permission at that instant, and a
tool's ``authorize`` callable answers against a read-only store (R-226, R-365).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from kaizen_plugins import artifacts as artifact_tools
from kaizen_plugins import library as library_tools
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from kaizen_server_extension.host.bundle import resource_digest
from kaizen_server_extension.host.tool_backend import PipelineToolBackend
from kaizen_server_extension.policy.guardrails import ALLOW, GuardrailCall, GuardrailChain
from kaizen_server_extension.protocol.authority import AuthorityBundle, AuthorityRejected
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.tools import (
    ResourceContext,
    ResourceVerdict,
    RoomClass,
    ToolContext,
    WriteCategory,
    tool,
)
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.registry import ToolRegistry
from kaizen_server_extension.tools.types import RegisteredTool

MEMBER = "alice"
_WRITE: dict[str, Any] = dict(capability=Capability.WRITE,
                              room_class=RoomClass.ACTOR_BOUND_WRITE,
                              write_category=WriteCategory.MEMBER_STORE)


class Ran:
    """What the test tools and authorize callables saw."""

    def __init__(self) -> None:
        self.executed: list[dict[str, Any]] = []
        self.authorized: list[tuple[str, dict[str, Any]]] = []


RAN = Ran()


@tool(name="note_write", **_WRITE)
async def note_write(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Write a note (a member-store write without resource authorization)."""
    RAN.executed.append({"tool": "note_write", "text": text})
    return {"saved": text}


async def _allow_and_record(ctx: ResourceContext,
                            arguments: Mapping[str, Any]) -> ResourceVerdict:
    RAN.authorized.append((ctx.member, dict(arguments)))
    return ResourceVerdict.allow()


@tool(name="guarded_write", authorize=_allow_and_record, **_WRITE)
async def guarded_write(ctx: ToolContext, target: str) -> dict[str, Any]:
    """Write to a target the tool authorizes first."""
    RAN.executed.append({"tool": "guarded_write", "target": target})
    return {"written": target}


async def _writes_core_row(ctx: ResourceContext,
                           arguments: Mapping[str, Any]) -> ResourceVerdict:
    async with ctx.store.transaction() as tx:
        await tx.audit(ctx.member, "sneaky.authorize", {"target": arguments.get("target")})
    return ResourceVerdict.allow()


async def _writes_through_a_repository(ctx: ResourceContext,
                                       arguments: Mapping[str, Any]) -> ResourceVerdict:
    await ctx.store.members.ensure("mallory")  # an ORM add + flush
    return ResourceVerdict.allow()


async def _raises(ctx: ResourceContext, arguments: Mapping[str, Any]) -> ResourceVerdict:
    raise RuntimeError("lookup against internal-db.example:5432 failed")


def _mutating_tool(name: str, authorize: Any) -> RegisteredTool:
    async def impl(ctx: ToolContext, target: str) -> dict[str, Any]:
        RAN.executed.append({"tool": name, "target": target})
        return {"written": target}

    impl.__doc__ = "A write whose authorize misbehaves."
    return tool(name=name, authorize=authorize, **_WRITE)(impl)


WRITES_CORE = _mutating_tool("authorize_writes_core", _writes_core_row)
WRITES_ORM = _mutating_tool("authorize_writes_orm", _writes_through_a_repository)
RAISES = _mutating_tool("authorize_raises", _raises)

TEST_TOOLS = (note_write, guarded_write, WRITES_CORE, WRITES_ORM, RAISES,
              artifact_tools.update_artifact, artifact_tools.edit_artifact,
              library_tools.manage_library)


@pytest.fixture(autouse=True)
def _fresh_record() -> None:
    RAN.executed.clear()
    RAN.authorized.clear()


def _registry() -> ToolRegistry:
    registry = ToolRegistry(manifest={})
    for item in TEST_TOOLS:
        registry.register(item, owner="tests.write_guard")
    return registry


async def _caller(store: Store, *, guardrails: GuardrailChain | None = None,
                  approval_mode: str = "never_ask") -> tuple[
        PipelineToolBackend, AuthorityBundle, Any]:
    """A member, an agent allowed every test tool, a private room and an admitted run; the
    run's real guarded caller."""
    await store.members.ensure(MEMBER)
    await store.members.update_settings(MEMBER, approval_mode=approval_mode, model=None)
    agent = await store.agents.ensure_system_agent(
        "guarded", "Guarded", persona="p", mode="chat",
        tool_ceiling=[t.descriptor.name for t in TEST_TOOLS])
    conversation = await store.conversations.create(MEMBER, agent.id, "room", shared=False)
    backend = PipelineToolBackend(store, _registry(), discovery_enabled=False,
                                  metrics=ToolMetrics(CollectorRegistry()),
                                  guardrails=guardrails)
    lane = RunLane(store)
    await store.inputs.accept(conversation.id, MEMBER, "go", kind="message",
                              idempotency_key=None)
    run = await lane.claim_next(conversation.id, "test", timedelta(minutes=5))
    assert run is not None
    live = await store.runs.conversation_of(run.conversation_id)
    tools = backend.freeze(agent=agent, conversation=live, member=MEMBER, request_text="go")
    bundle = AuthorityBundle(
        run_id=run.id, conversation_id=run.conversation_id, input_position=run.input_position,
        member=run.member, agent_version_id=agent.version_id,
        audience_version=live.audience_version,
        resource_digest=resource_digest(live, agent, tools.digest), fence=run.fence)
    assert await lane.admit(run.id, run.fence, Admission(
        agent_version_id=agent.version_id, audience_version=live.audience_version,
        resource_digest=bundle.resource_digest, catalog_digest=tools.digest, model="fake",
    ), {"input_position": run.input_position})
    caller = backend.caller(bundle=bundle, tools=tools, cancelled=asyncio.Event())
    return backend, bundle, caller


async def _call(caller: Any, bundle: AuthorityBundle, name: str, arguments: dict[str, Any],
                call_id: str = "c1", step: int = 1) -> ToolCallResult:
    result: ToolCallResult = await caller(
        bundle, ToolCallRequest(call_id, name, json.dumps(arguments), step))
    return result


async def _audit_rows(store: Store, *, action: str | None = None,
                      call_id: str | None = None) -> list[dict[str, Any]]:
    async with store.transaction() as tx:
        query = select(m.AuditEvent.action, m.AuditEvent.data)
        if action is not None:
            query = query.where(m.AuditEvent.action == action)
        rows = (await tx.session.execute(query)).all()
    return [{"action": a, **dict(d)} for a, d in rows
            if call_id is None or dict(d).get("call_id") == call_id]


# --- the write guard: the run and the permission, at the last instant -------------------------


@pytest.mark.rule("R-223", "R-226")
async def test_a_permission_revoked_after_the_gate_stops_the_write_before_it_runs(
        store: Store) -> None:
    backend: PipelineToolBackend | None = None

    async def admin_revokes_meanwhile(call: GuardrailCall) -> Any:
        # Stands for an administrator's revocation landing after the call's permission check
        # and approval gate, just before execution.
        assert backend is not None
        await backend.permissions.set_policy(call.request.name, MEMBER, False, "admin")
        return ALLOW

    backend, bundle, caller = await _caller(
        store, guardrails=GuardrailChain([admin_revokes_meanwhile]))
    result = await _call(caller, bundle, "note_write", {"text": "hello"})
    assert RAN.executed == []  # the write never ran
    assert result.outcome is ToolOutcome.ERROR and result.closes_turn
    assert result.close_reason == "permission_denied"
    audited = await _audit_rows(store, action="tool.call", call_id="c1")
    assert [row["outcome"] for row in audited] == ["error"]


@pytest.mark.rule("R-223", "R-226")
async def test_a_run_cancelled_after_the_gate_is_never_executed(store: Store) -> None:
    async def member_stops_meanwhile(call: GuardrailCall) -> Any:
        await RunLane(store).cancel(call.bundle.run_id, MEMBER)
        return ALLOW

    _, bundle, caller = await _caller(
        store, guardrails=GuardrailChain([member_stops_meanwhile]))
    with pytest.raises(AuthorityRejected):  # not ours any more: nothing is settled
        await _call(caller, bundle, "note_write", {"text": "hello"})
    assert RAN.executed == []


async def test_a_read_is_not_held_by_the_write_guard_but_a_write_is(store: Store) -> None:
    """Control for the two tests above: without interference the same write runs."""
    _, bundle, caller = await _caller(store)
    result = await _call(caller, bundle, "note_write", {"text": "hello"})
    assert result.outcome is ToolOutcome.OK
    assert RAN.executed == [{"tool": "note_write", "text": "hello"}]


# --- the tool's own resource authorization ---------------------------------------------------


@pytest.mark.rule("R-226")
async def test_authorize_sees_the_member_and_the_validated_arguments_before_the_tool_runs(
        store: Store) -> None:
    _, bundle, caller = await _caller(store)
    result = await _call(caller, bundle, "guarded_write", {"target": "notes/1"})
    assert result.outcome is ToolOutcome.OK
    assert RAN.authorized == [(MEMBER, {"target": "notes/1"})]
    assert RAN.executed == [{"tool": "guarded_write", "target": "notes/1"}]


@pytest.mark.rule("R-365")
@pytest.mark.parametrize("name", ["authorize_writes_core", "authorize_writes_orm"])
async def test_an_authorize_that_tries_to_write_is_refused_and_wrote_nothing(
        store: Store, name: str) -> None:
    _, bundle, caller = await _caller(store)
    result = await _call(caller, bundle, name, {"target": "x"})
    assert RAN.executed == []  # the tool never ran
    assert result.outcome is ToolOutcome.ERROR and result.closes_turn
    assert result.close_reason == "resource_check_failed"
    assert "internal error" in result.content and "not run" in result.content
    assert await _audit_rows(store, action="sneaky.authorize") == []
    assert await store.members.get("mallory") is None
    # The connection the check used is writable again for everyone else.
    await store.members.ensure("zoe")
    assert await store.members.get("zoe") is not None


@pytest.mark.rule("R-364")
async def test_an_authorize_that_fails_is_an_internal_error_without_outcome_claim(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    _, bundle, caller = await _caller(store)
    result = await _call(caller, bundle, "authorize_raises", {"target": "x"})
    assert RAN.executed == []
    assert result.close_reason == "resource_check_failed"
    assert "internal-db.example" not in result.content  # the exception text stays in the log
    assert "unknown" not in result.content  # no claim about an outcome
    assert any("internal-db.example" in r.getMessage() for r in caplog.records
               if r.levelname == "WARNING")


@pytest.mark.rule("R-226", "R-243")
async def test_update_artifact_on_another_members_artifact_is_refused_before_it_runs(
        store: Store) -> None:
    artifacts = ArtifactStore(store)
    await store.members.ensure("bob")
    _, bundle, caller = await _caller(store)
    bobs = await artifacts.create("bob", title="Bob's", kind="markdown", content="bob v1",
                                  where=WriteContext(None, None))
    mine = await artifacts.create(MEMBER, title="Mine", kind="markdown", content="v1",
                                  where=WriteContext(None, None))

    refused = await _call(caller, bundle, "update_artifact",
                          {"artifact_id": bobs.artifact_id, "content": "hijacked"})
    assert refused.outcome is ToolOutcome.ERROR and not refused.closes_turn
    assert "No such artifact" in refused.content and "was not run" in refused.content
    latest = await artifacts.resolve("bob", bobs.artifact_id)
    assert (latest.version, latest.text()) == (1, "bob v1")  # nothing was written
    audited = await _audit_rows(store, action="tool.call", call_id="c1")
    assert audited[0]["outcome"] == "error"
    assert audited[0]["raw"] == {"refused": "artifact_not_found",
                                 "stage": "resource_authorization"}

    missing = await _call(caller, bundle, "edit_artifact",
                          {"artifact_id": "f" * 32, "version": 1, "tag": "ABCD",
                           "edits": "CUT 1.=1"}, call_id="c2", step=2)
    assert missing.outcome is ToolOutcome.ERROR and "was not run" in missing.content

    allowed = await _call(caller, bundle, "update_artifact",
                          {"artifact_id": mine.artifact_id, "content": "v2"},
                          call_id="c3", step=3)
    assert allowed.outcome is ToolOutcome.OK, allowed.content
    assert (await artifacts.resolve(MEMBER, mine.artifact_id)).version == 2


@pytest.mark.rule("R-226")
async def test_manage_library_into_a_foreign_collection_is_refused_before_it_runs(
        store: Store) -> None:
    artifacts = ArtifactStore(store)
    library = LibraryStore(store, artifacts)
    await store.members.ensure("bob")
    _, bundle, caller = await _caller(store)
    doc = await artifacts.create(MEMBER, title="Doc", kind="markdown", content="d",
                                 where=WriteContext(None, None))
    bobs_collection = await _collection(store, "bob")
    refused = await _call(caller, bundle, "manage_library", {
        "action": "file_into_collection", "destination_id": bobs_collection,
        "item_id": doc.artifact_id})
    assert refused.outcome is ToolOutcome.ERROR and "was not run" in refused.content
    assert await _count(store, m.LibraryCollectionItem) == 0
    assert await library.collection_items("bob", bobs_collection) == []


async def _collection(store: Store, owner: str) -> str:
    from kaizen_server_extension.store.core import new_id, utcnow

    ident = new_id()
    async with store.transaction() as tx:
        tx.session.add(m.LibraryCollection(id=ident, owner=owner, name="Bob's papers",
                                           created_at=utcnow()))
    return ident


async def _count(store: Store, model: Any) -> int:
    async with store.transaction() as tx:
        return int((await tx.session.execute(
            select(func.count()).select_from(model))).scalar_one())


# --- declaration and wiring fail closed ------------------------------------------------------


def test_an_authorize_that_is_not_async_is_refused_at_declaration() -> None:
    from kaizen_server_extension.tools.decorators import ToolDeclarationError

    def sync_check(ctx: ResourceContext, arguments: Mapping[str, Any]) -> ResourceVerdict:
        return ResourceVerdict.allow()

    async def impl(ctx: ToolContext) -> None:
        """A write."""

    with pytest.raises(ToolDeclarationError, match="authorize"):
        tool(name="sync_authorize", authorize=sync_check, **_WRITE)(impl)  # type: ignore[arg-type]


@pytest.mark.rule("R-226")
async def test_a_tool_with_authorize_fails_closed_where_no_resource_check_is_wired() -> None:
    from tests.policy.fakes import harness

    h = harness(guarded_write)  # in-memory ports, no resource authorizer
    result = await h.call("guarded_write", json.dumps({"target": "t"}))
    assert h.executed == [] and RAN.executed == []
    assert result.closes_turn and result.close_reason == "resource_check_unavailable"
