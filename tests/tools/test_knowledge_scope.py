"""R-002: an agent's knowledge scope only narrows retrieval; it never widens it beyond the
member's access.

The scope is declared on the agent definition (validated at registration), kept on the
immutable agent version (a changed scope is a new version) and handed to the run's tools. The
retrieval tools (``inspect_library``, ``read_artifact``) are called here through the run's
real guarded caller, on SQLite and PostgreSQL, for a scoped agent and for the unscoped General
agent over the same Library.

The Library of every test (``_library``)::

    alice  collection "In scope"    : doc_in             <- scoped
           collection "Outside"     : doc_out
           collection "Via project" : doc_via            (linked from project "Sub")
           project "Scoped project" : links project "Sub" <- scoped
           project "Sub"            : links collection "Via project", artifact doc_linked
           project "Unscoped"       : links artifact doc_out
    bob    collection "Bob private" : bob_doc, shared_by_alice   <- named in alice's scope
                                      (shared_by_alice is alice's, bound to a room bob is in)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest
from kaizen_plugins.agents import GENERAL
from prometheus_client import CollectorRegistry

from kaizen_server_extension.agents import (
    AgentDefinition,
    AgentRegistrationError,
    KnowledgeScope,
    collect_agents,
)
from kaizen_server_extension.host.bundle import resource_digest
from kaizen_server_extension.host.tool_backend import PipelineToolBackend
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolOutcome
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.store.records import AgentRecord
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.registry import ToolRegistry

MEMBER = "alice"
RETRIEVAL_TOOLS = ("inspect_library", "read_artifact")
BASE = {"agent_id": "librarian", "name": "Librarian", "mode": "search",
        "persona": "Answer from the member's notes."}


# --- registration ---------------------------------------------------------------------------


@pytest.mark.rule("R-002")
@pytest.mark.parametrize("scope, complaint", [
    ({"collection": ["abc"]}, "knowledge_scope.collection: Extra inputs"),
    ({"collections": ["not an id!"]}, "knowledge_scope.collections"),
    ({"projects": "abc"}, "knowledge_scope.projects"),
    ({"collections": [f"c{i}" for i in range(201)]}, "at most 200"),
])
def test_an_invalid_knowledge_scope_stops_registration_naming_the_agent(
        scope: dict[str, Any], complaint: str) -> None:
    with pytest.raises(AgentRegistrationError) as refused:
        collect_agents([("notes_pack", {**BASE, "knowledge_scope": scope})])
    message = str(refused.value)
    assert "notes_pack" in message and "'librarian'" in message and complaint in message
    # A definition the plugin builds itself is refused the same way, naming the agent.
    with pytest.raises(ValueError, match="agent 'librarian' is invalid"):
        AgentDefinition.model_validate({**BASE, "knowledge_scope": scope})


@pytest.mark.rule("R-002")
def test_a_knowledge_scope_is_declared_data_with_one_stored_form() -> None:
    (scoped, plain) = collect_agents([
        ("notes_pack", {**BASE, "knowledge_scope": {"collections": ["b", "a", "b"],
                                                     "projects": ["p"]}}),
        ("notes_pack", {**BASE, "agent_id": "plain"})])
    assert scoped.knowledge_scope.narrows
    assert scoped.knowledge_scope.stored() == {"collections": ["a", "b"], "projects": ["p"]}
    # Absent and empty are both "no narrowing", stored as the {} every older version holds.
    assert not plain.knowledge_scope.narrows and plain.knowledge_scope.stored() == {}
    assert KnowledgeScope(collections=frozenset(), projects=frozenset()).stored() == {}
    assert KnowledgeScope.from_stored(scoped.knowledge_scope.stored()) == \
        scoped.knowledge_scope


# --- the immutable agent version -------------------------------------------------------------


async def _seed(store: Store, agent_id: str, scope: KnowledgeScope) -> AgentRecord:
    return await store.agents.ensure_system_agent(
        agent_id, "Librarian", persona=BASE["persona"], mode="search",
        tool_ceiling=list(RETRIEVAL_TOOLS), knowledge_scope=scope)


@pytest.mark.rule("R-002")
async def test_a_changed_knowledge_scope_makes_a_new_agent_version(store: Store) -> None:
    first_scope = KnowledgeScope(collections=frozenset({"c1"}))
    first = await _seed(store, "librarian", first_scope)
    same = await _seed(store, "librarian", KnowledgeScope(collections=frozenset({"c1"})))
    changed = await _seed(store, "librarian", KnowledgeScope(collections=frozenset({"c1"}),
                                                              projects=frozenset({"p1"})))
    unscoped = await _seed(store, "librarian", KnowledgeScope())
    assert [r.version for r in (first, same, changed, unscoped)] == [1, 1, 2, 3]
    assert [r.knowledge_scope for r in (first, changed, unscoped)] == [
        {"collections": ["c1"], "projects": []},
        {"collections": ["c1"], "projects": ["p1"]}, {}]
    # The older version is kept as it was: a run admitted on it keeps its scope.
    async with store.transaction() as tx:
        kept = await tx.session.get(m.AgentVersion, first.version_id)
        assert kept is not None and kept.knowledge_scope == first_scope.stored()
    # And the scope is part of what a run's resource digest binds.
    await store.members.ensure(MEMBER)
    room = await store.conversations.create(MEMBER, "librarian", "room", shared=False)
    assert resource_digest(room, first, "catalog") != resource_digest(
        room, replace(first, knowledge_scope=changed.knowledge_scope), "catalog")


@pytest.mark.rule("R-002")
async def test_an_unscoped_agent_seeded_before_scopes_keeps_its_version(store: Store) -> None:
    before = await store.agents.ensure_system_agent(
        "general", "General", persona="p", mode="chat", tool_ceiling=["read_artifact"])
    after = await store.agents.ensure_system_agent(
        "general", "General", persona="p", mode="chat", tool_ceiling=["read_artifact"],
        knowledge_scope=KnowledgeScope())
    assert (before.version, after.version, after.knowledge_scope) == (1, 1, {})


# --- through the run's guarded caller ---------------------------------------------------------


@dataclass(frozen=True)
class Library:
    collections: dict[str, str]
    projects: dict[str, str]
    artifacts: dict[str, str]


async def _library(store: Store) -> Library:
    for member in (MEMBER, "bob"):
        await store.members.ensure(member)
    artifacts, library = ArtifactStore(store), LibraryStore(store)

    async def doc(owner: str, title: str, where: WriteContext | None = None) -> str:
        return (await artifacts.create(owner, title=title, kind="markdown",
                                       content=f"# {title}\n", where=where)).artifact_id

    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    shared = await store.conversations.create("bob", "general", "shared", shared=True)
    await store.conversations.add_participant(shared.id, "bob", MEMBER)
    docs = {"in": await doc(MEMBER, "Doc in"), "out": await doc(MEMBER, "Doc out"),
            "via": await doc(MEMBER, "Doc via"), "linked": await doc(MEMBER, "Doc linked"),
            "bob": await doc("bob", "Bob's doc"),
            "shared_by_alice": await doc(MEMBER, "Shared by alice", WriteContext(shared.id))}
    cols = {"in": await library.create_collection(MEMBER, "In scope"),
            "out": await library.create_collection(MEMBER, "Outside"),
            "via": await library.create_collection(MEMBER, "Via project"),
            "bob": await library.create_collection("bob", "Bob private")}
    projects = {"scoped": await library.create_project(MEMBER, "Scoped project"),
                "sub": await library.create_project(MEMBER, "Sub"),
                "unscoped": await library.create_project(MEMBER, "Unscoped")}
    for collection, artifact in (("in", "in"), ("out", "out"), ("via", "via")):
        await library.file_into_collection(MEMBER, cols[collection], docs[artifact])
    await library.file_into_collection("bob", cols["bob"], docs["bob"])
    # Bob can see alice's room-bound artifact, so he may file it in his private collection;
    # which of alice's artifacts bob filed there is bob's business, not alice's agent's.
    await library.file_into_collection("bob", cols["bob"], docs["shared_by_alice"])
    await library.link_into_project(MEMBER, projects["scoped"], "project", projects["sub"])
    await library.link_into_project(MEMBER, projects["sub"], "collection", cols["via"])
    await library.link_into_project(MEMBER, projects["sub"], "artifact", docs["linked"])
    await library.link_into_project(MEMBER, projects["unscoped"], "artifact", docs["out"])
    return Library(cols, projects, docs)


def _scope_of(library: Library) -> KnowledgeScope:
    """Alice's "In scope" collection and "Scoped project", plus bob's private collection."""
    return KnowledgeScope(collections=frozenset({library.collections["in"],
                                                 library.collections["bob"]}),
                          projects=frozenset({library.projects["scoped"]}))


class Turn:
    """One admitted run of an agent for alice, with the run's real guarded caller."""

    def __init__(self, store: Store, bundle: AuthorityBundle, caller: Any) -> None:
        self.store, self.bundle, self._caller, self._calls = store, bundle, caller, 0

    async def call(self, name: str, **arguments: Any) -> tuple[ToolOutcome, str]:
        self._calls += 1
        result = await self._caller(self.bundle, ToolCallRequest(
            f"call-{self._calls}", name, json.dumps(arguments), self._calls))
        return result.outcome, result.content

    async def listed(self, surface: str) -> set[str]:
        outcome, content = await self.call("inspect_library", surface=surface)
        assert outcome is ToolOutcome.OK, content
        return {item["id"] for item in json.loads(content)["items"]}

    async def finish(self) -> None:
        """Settle the run, so the room may admit the next one."""
        assert await RunLane(self.store).settle(self.bundle.run_id, "completed", "answered",
                                                "test", fence=self.bundle.fence)


async def _turn(store: Store, agent: AgentRecord, room: str | None = None) -> Turn:
    if room is None:
        room = (await store.conversations.create(MEMBER, agent.id, "room", shared=False)).id
    backend = PipelineToolBackend(store, ToolRegistry.from_plugins(load_entrypoints=False),
                                  discovery_enabled=False,
                                  metrics=ToolMetrics(CollectorRegistry()))
    lane = RunLane(store)
    await store.inputs.accept(room, MEMBER, "what do my notes say?", kind="message",
                              idempotency_key=None)
    run = await lane.claim_next(room, "test", timedelta(minutes=5))
    assert run is not None
    live = await store.runs.conversation_of(run.conversation_id)
    tools = backend.freeze(agent=agent, conversation=live, member=MEMBER, request_text="go")
    bundle = AuthorityBundle(
        run_id=run.id, conversation_id=run.conversation_id, input_position=run.input_position,
        member=MEMBER, agent_version_id=agent.version_id,
        audience_version=live.audience_version,
        resource_digest=resource_digest(live, agent, tools.digest), fence=run.fence)
    assert await lane.admit(run.id, run.fence, Admission(
        agent_version_id=agent.version_id, audience_version=live.audience_version,
        resource_digest=bundle.resource_digest, catalog_digest=tools.digest, model="fake",
    ), {"input_position": run.input_position})
    return Turn(store, bundle,
                backend.caller(bundle=bundle, tools=tools, cancelled=asyncio.Event()))


async def _readable(store: Store, agent: AgentRecord, artifact_id: str,
                    room: str | None = None) -> bool:
    """Whether the agent's ``read_artifact`` reads it, in a turn of its own (a turn stops a
    tool after repeated failures)."""
    turn = await _turn(store, agent, room)
    try:
        outcome, content = await turn.call("read_artifact", artifact_id=artifact_id)
        if outcome is ToolOutcome.OK:
            return True
        # Out of reach reads exactly like an id that names nothing: not found, nothing else.
        assert content == (await turn.call("read_artifact", artifact_id="0" * 32))[1]
        return False
    finally:
        await turn.finish()


@pytest.mark.rule("R-002")
async def test_a_scoped_agent_retrieves_only_the_members_items_inside_its_scope(
        store: Store) -> None:
    library = await _library(store)
    agent = await _seed(store, "librarian", _scope_of(library))
    cols, projects, docs = library.collections, library.projects, library.artifacts

    turn = await _turn(store, agent)
    assert await turn.listed("collections") == {cols["in"], cols["via"]}
    assert await turn.listed("projects") == {projects["scoped"], projects["sub"]}
    assert await turn.listed("artifacts") == {docs["in"], docs["via"], docs["linked"]}
    for name in ("in", "via", "linked"):
        assert await _readable(store, agent, docs[name]), name
    # Alice can open "Doc out" herself, but it is outside the agent's scope.
    assert not await _readable(store, agent, docs["out"])


@pytest.mark.rule("R-002")
async def test_a_scope_naming_another_members_private_collection_exposes_nothing(
        store: Store) -> None:
    library = await _library(store)
    agent = await _seed(store, "librarian", _scope_of(library))
    cols, docs = library.collections, library.artifacts

    turn = await _turn(store, agent)
    assert cols["bob"] not in await turn.listed("collections")
    listed = await turn.listed("artifacts")
    # Neither bob's document nor alice's own artifact that bob filed in his collection:
    # the scope reaches only collections alice owns, so bob's filing stays his.
    assert docs["bob"] not in listed and docs["shared_by_alice"] not in listed
    assert not await _readable(store, agent, docs["bob"])
    assert not await _readable(store, agent, docs["shared_by_alice"])
    # A scope naming only bob's collection reaches nothing at all (not "everything").
    only_bobs = await _seed(store, "bobs-reader", KnowledgeScope(
        collections=frozenset({cols["bob"]})))
    turn = await _turn(store, only_bobs)
    for surface in ("collections", "projects", "artifacts"):
        assert await turn.listed(surface) == set(), surface
    assert not await _readable(store, only_bobs, docs["in"])


@pytest.mark.rule("R-002")
async def test_an_unscoped_agent_retrieves_what_the_member_can_open_as_before(
        store: Store) -> None:
    library = await _library(store)
    general = await store.agents.ensure_system_agent(
        GENERAL.agent_id, GENERAL.name, persona=GENERAL.persona, mode=GENERAL.mode,
        tool_ceiling=list(GENERAL.tool_ceiling))
    assert general.knowledge_scope == {}
    turn = await _turn(store, general)
    member_view = LibraryStore(store)
    for surface in ("collections", "projects", "artifacts"):
        assert await turn.listed(surface) == {
            item["id"] for item in await member_view.inspect(MEMBER, surface)}, surface
    assert library.collections["bob"] not in await turn.listed("collections")
    for name in ("in", "out", "via", "linked", "shared_by_alice"):
        assert await _readable(store, general, library.artifacts[name]), name
    assert not await _readable(store, general, library.artifacts["bob"])  # never alice's


@pytest.mark.rule("R-002")
async def test_a_scoped_agent_still_reads_what_this_conversation_made(store: Store) -> None:
    """The conversation's own artifacts are not Library knowledge: an artifact created in
    this room stays readable, but writing a new version of an out-of-scope artifact here
    does not pull it into reach."""
    library = await _library(store)
    agent = await _seed(store, "librarian", _scope_of(library))
    room = (await store.conversations.create(MEMBER, agent.id, "room", shared=False)).id
    artifacts = ArtifactStore(store)
    made_here = await artifacts.create(MEMBER, title="Draft", kind="markdown", content="d",
                                       where=WriteContext(room))
    await artifacts.update(MEMBER, library.artifacts["out"], content="rewritten",
                           expected_version=1, where=WriteContext(room))
    assert await _readable(store, agent, made_here.artifact_id, room)
    assert not await _readable(store, agent, library.artifacts["out"], room)
