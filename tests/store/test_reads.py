"""The read units (store/reads.py): the same records as the ORM reads they replace, typed
values included, on both databases; the participant checks; and, on SQLite, reads that
neither wait for this process's writer nor give up when the database is busy."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest
from sqlalchemy import and_, select

from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.store import Store, reads
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.records import AgentRecord, ConversationRecord
from kaizen_server_extension.store.units import SQLiteRunner, Unit

SCOPE = {"documents": ["doc-1"], "collections": []}


async def _room(store: Store, *, shared: bool = True) -> ConversationRecord:
    for member in ("alice", "bob"):
        await store.members.ensure(member)
    await store.agents.ensure_system_agent("general", "General", persona="Be brief.",
                                           mode="chat", tool_ceiling=["search", "run_code"])
    room = await store.conversations.create("alice", "general", "A room", shared)
    if shared:
        room = await store.conversations.add_participant(room.id, "alice", "bob")
    return room


async def _orm_conversation(store: Store, conversation_id: str) -> ConversationRecord:
    """The record as the ORM path built it before the read units."""
    async with store.transaction() as tx:
        conv = await tx.session.get(m.Conversation, conversation_id)
        assert conv is not None
        return await store.conversations._record(tx, conv)


async def test_a_conversation_reads_as_the_orm_built_it(store: Store) -> None:
    room = await _room(store)
    await store.inputs.accept(room.id, "bob", "hello", kind="message", idempotency_key=None)
    claimed = await store.runs.admission_facts(
        (await store.journal.read(room.id, "alice"))[-1].run_id or "")
    assert claimed.run.status == "queued"

    read = await store.runs.conversation_of(room.id)

    assert read == await _orm_conversation(store, room.id)
    assert read.participants == ("alice", "bob")
    assert read.shared is True and isinstance(read.shared, bool)
    assert read.created_at.tzinfo is not None and read.updated_at >= read.created_at
    assert await store.conversations.get_for(room.id, "bob") == read


async def test_a_room_is_not_found_by_someone_outside_it(store: Store) -> None:
    room = await _room(store, shared=False)
    await store.members.ensure("mallory")

    with pytest.raises(NotFound):
        await store.conversations.get_for(room.id, "mallory")
    with pytest.raises(NotFound):
        await store.journal.read(room.id, "mallory")
    assert await store.read(reads.conversation_record, room.id, "mallory") is None
    assert await store.read(reads.conversation_record, "no-such-room") is None


async def test_agents_and_members_read_with_their_json_and_booleans(store: Store) -> None:
    await store.members.ensure("alice")
    await store.members.update_settings("alice", approval_mode="never_ask", model="m-1",
                                        tool_result_compression=True)
    from kaizen_server_extension.agents import KnowledgeScope

    await store.agents.ensure_system_agent(
        "librarian", "Librarian", persona="Cite.", mode="search",
        tool_ceiling=["search", "query_document"],
        knowledge_scope=KnowledgeScope.from_stored(SCOPE))

    agent = await store.agents.get_visible("librarian", "alice")
    member = await store.members.get("alice")

    async with store.transaction() as tx:
        row = (await tx.session.execute(
            select(m.Agent, m.AgentVersion).join(m.AgentVersion, and_(
                m.AgentVersion.agent_id == m.Agent.id,
                m.AgentVersion.version == m.Agent.current_version))
            .where(m.Agent.id == "librarian"))).one()
    assert agent == AgentRecord(
        id="librarian", name="Librarian", owner=None, version=row[1].version,
        version_id=row[1].id, persona="Cite.", tool_ceiling=("search", "query_document"),
        knowledge_scope=dict(row[1].knowledge_scope), mode="search")
    assert agent.knowledge_scope == KnowledgeScope.from_stored(SCOPE).stored()
    assert member is not None and member.tool_result_compression is True
    assert (member.approval_mode, member.model) == ("never_ask", "m-1")
    assert await store.members.get("nobody") is None
    assert await store.agents.get_visible("no-such-agent", "alice") is None


async def test_an_agent_of_one_member_is_invisible_to_another(store: Store) -> None:
    for member in ("alice", "bob"):
        await store.members.ensure(member)
    async with store.transaction() as tx:
        tx.session.add(m.Agent(id="mine", name="Mine", owner="alice", current_version=1,
                               created_at=utcnow()))
        await tx.session.flush()
        tx.session.add(m.AgentVersion(id="mine@1", agent_id="mine", version=1, persona="p",
                                      tool_ceiling=[], knowledge_scope={}, mode="chat",
                                      created_at=utcnow()))

    assert (await store.agents.get_visible("mine", "alice")) is not None
    assert await store.agents.get_visible("mine", "bob") is None
    assert await store.agents.get_visible("mine", None) is None


async def test_the_journal_pages_and_the_exchanges_keep_their_documents(store: Store) -> None:
    room = await _room(store)
    text = "naïve — 東京 «quoted»"
    await store.inputs.accept(room.id, "alice", text, kind="message", idempotency_key="k1")
    await store.inputs.accept(room.id, "bob", "second", kind="message", idempotency_key=None)

    page = await store.journal.read(room.id, "bob", after=0, limit=100)
    assert [e.seq for e in page] == list(range(1, len(page) + 1))
    assert all(e.at.tzinfo is not None and isinstance(e.data, dict) for e in page)
    assert [e.seq for e in await store.journal.read(room.id, "bob", after=1, limit=1)] == [2]

    history = await store.journal.exchanges(room.id)
    assert [(e.type, e.data["text"]) for e in history] == [
        ("input.accepted", text), ("input.accepted", "second")]


async def test_admission_facts_carry_the_task_posture(store: Store) -> None:
    room = await _room(store)
    accepted = await store.inputs.accept(room.id, "alice", "go", kind="message",
                                         idempotency_key=None)

    facts = await store.runs.admission_facts(accepted.run_id)

    assert (facts.run.id, facts.text, facts.model, facts.posture) == (
        accepted.run_id, "go", None, "chat")
    with pytest.raises(NotFound):
        await store.runs.admission_facts("no-such-run")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_read_does_not_wait_for_this_processs_writer(store: Store) -> None:
    """A session transaction holds the writer gate across awaits; a read meanwhile answers
    at once with the last commit, not the open transaction's write."""
    room = await _room(store)
    writing = asyncio.Event()
    release = asyncio.Event()

    async def writer() -> None:
        async with store.transaction() as tx:
            conv = await tx.session.get(m.Conversation, room.id)
            assert conv is not None
            conv.title = "uncommitted"
            await tx.session.flush()
            writing.set()
            await release.wait()

    task = asyncio.create_task(writer())
    await writing.wait()
    read = await asyncio.wait_for(store.runs.conversation_of(room.id), 5)
    release.set()
    await task

    assert read.title == "A room"
    assert (await store.runs.conversation_of(room.id)).title == "uncommitted"


class _BusyOnce:
    """The loop thread's SQLite connection, answering its first SELECT "database is
    locked" as SQLite does when another process holds the database (a WAL recovery, an
    exclusive checkpoint); everything else goes to the real connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.refused = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith("SELECT") and not self.refused:
            self.refused += 1
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
            raise error
        return self._db.execute(sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_read_finding_sqlite_busy_is_made_again_on_the_pooled_connection(
    store: Store,
) -> None:
    room = await _room(store)
    runner = store._units
    assert isinstance(runner, SQLiteRunner)
    real = runner._loop_connection()
    assert real is not None
    busy = _BusyOnce(real)
    runner._loop_db = busy  # type: ignore[assignment]
    made: list[str] = []

    def counted(conversation_id: str) -> Unit[ConversationRecord | None]:
        made.append(conversation_id)
        return (yield from reads.conversation_record(conversation_id))

    try:
        read = await store.read(counted, room.id)
    finally:
        runner._loop_db = real

    assert busy.refused == 1 and not real.in_transaction
    assert made == [room.id, room.id]  # a fresh unit for the second attempt
    assert read == await _orm_conversation(store, room.id)
