"""The database itself holds the invariants (DESIGN.md), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m


async def _room(store: Store, owner: str = "alice", shared: bool = False) -> str:
    await store.members.ensure(owner)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    conversation = await store.conversations.create(owner, "general", "room", shared)
    return conversation.id


async def test_migrated_schema_matches_the_models(store: Store) -> None:
    def known(name: str | None, _type: str, _parents: object) -> bool:
        # The full-text index objects each database declares its own way (migration 0014).
        return name not in m.FULL_TEXT_OBJECTS

    def diff(sync_conn: object) -> list[object]:
        context = MigrationContext.configure(  # type: ignore[arg-type]
            sync_conn, opts={"include_name": known})
        return list(compare_metadata(context, m.Base.metadata))

    async with store.engine.connect() as conn:
        differences = await conn.run_sync(diff)
    assert differences == []


async def test_concurrent_accepts_get_unique_gapless_positions_and_seqs(store: Store) -> None:
    room = await _room(store)
    accepted = await asyncio.gather(*[
        store.inputs.accept(room, "alice", f"message {i}", kind="message",
                            idempotency_key=None)
        for i in range(25)
    ])
    assert sorted(a.position for a in accepted) == list(range(1, 26))
    events = await store.journal.read(room, "alice", limit=1000)
    assert [e.seq for e in events] == list(range(1, 26))
    # Each event carries the position its own input got: nothing lost or crossed.
    by_input = {e.data["input_id"]: e.data["position"] for e in events}
    assert by_input == {a.input_id: a.position for a in accepted}


async def test_database_rejects_a_duplicate_journal_seq(store: Store) -> None:
    room = await _room(store)
    async with store.transaction() as tx:
        await tx.append_event(room, "note", "alice", {})
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            tx.session.add(m.JournalEvent(conversation_id=room, seq=1, type="forged",
                                          actor="alice", at=datetime.now(UTC), data={}))


async def test_journal_rows_cannot_be_rewritten(store: Store) -> None:
    room = await _room(store)
    async with store.transaction() as tx:
        await tx.append_event(room, "note", "alice", {"v": 1})
    with pytest.raises(DBAPIError, match="immutable"):
        async with store.transaction() as tx:
            await tx.session.execute(update(m.JournalEvent).values(type="rewritten"))


async def test_agent_versions_are_immutable(store: Store) -> None:
    await _room(store)
    with pytest.raises(DBAPIError, match="immutable"):
        async with store.transaction() as tx:
            await tx.session.execute(update(m.AgentVersion).values(persona="changed"))


@pytest.mark.rule("R-024")
async def test_database_allows_one_active_run_per_room(store: Store) -> None:
    room = await _room(store)
    first = await store.inputs.accept(room, "alice", "one", kind="message",
                                      idempotency_key=None)
    second = await store.inputs.accept(room, "alice", "two", kind="message",
                                       idempotency_key=None)
    async with store.transaction() as tx:
        await tx.session.execute(update(m.Run).where(m.Run.id == first.run_id)
                                 .values(status="running"))
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            await tx.session.execute(update(m.Run).where(m.Run.id == second.run_id)
                                     .values(status="awaiting_approval"))


async def test_run_status_and_settlement_are_checked(store: Store) -> None:
    room = await _room(store)
    accepted = await store.inputs.accept(room, "alice", "one", kind="message",
                                         idempotency_key=None)
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            await tx.session.execute(update(m.Run).where(m.Run.id == accepted.run_id)
                                     .values(status="exploded"))
    # A terminal status without a settlement time is refused.
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            await tx.session.execute(update(m.Run).where(m.Run.id == accepted.run_id)
                                     .values(status="completed"))


async def test_idempotency_key_is_unique_per_conversation_in_the_database(store: Store) -> None:
    room = await _room(store)
    await store.inputs.accept(room, "alice", "one", kind="message", idempotency_key="k1")
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            await tx.session.execute(text(
                "INSERT INTO accepted_inputs (id, conversation_id, position, kind, member, "
                "text, text_digest, idempotency_key, created_at) VALUES "
                "('forged', :c, 99, 'message', 'alice', 'x', 'd', 'k1', :at)"
            ), {"c": room, "at": datetime.now(UTC)})


async def test_same_idempotency_key_answers_the_first_acceptance(store: Store) -> None:
    room = await _room(store)
    results = await asyncio.gather(*[
        store.inputs.accept(room, "alice", "hello", kind="message", idempotency_key="same")
        for _ in range(5)
    ])
    assert len({r.input_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await store.inputs.count(room) == 1
    with pytest.raises(Conflict):
        await store.inputs.accept(room, "alice", "different", kind="message",
                                  idempotency_key="same")


async def test_roster_changes_bump_the_audience_version(store: Store) -> None:
    room = await _room(store, shared=True)
    added = await store.conversations.add_participant(room, "alice", "bob")
    assert added.audience_version == 2 and added.participants == ("alice", "bob")
    again = await store.conversations.add_participant(room, "alice", "bob")
    assert again.audience_version == 2  # no change, no bump
    removed = await store.conversations.remove_participant(room, "alice", "bob")
    assert removed.audience_version == 3 and removed.participants == ("alice",)
    with pytest.raises(NotFound):
        await store.journal.read(room, "bob")


async def test_a_changed_system_agent_gets_a_new_version(store: Store) -> None:
    first = await store.agents.ensure_system_agent("helper", "Helper", persona="v1",
                                                   mode="chat", tool_ceiling=["a"])
    same = await store.agents.ensure_system_agent("helper", "Helper", persona="v1",
                                                  mode="chat", tool_ceiling=["a"])
    assert (first.version, same.version) == (1, 1)
    changed = await store.agents.ensure_system_agent("helper", "Helper", persona="v1",
                                                     mode="chat", tool_ceiling=["a", "b"])
    assert changed.version == 2 and changed.tool_ceiling == ("a", "b")
    assert changed.version_id != first.version_id


async def test_a_non_participants_message_is_refused_and_nothing_is_written(
    store: Store,
) -> None:
    room = await _room(store)
    await store.members.ensure("mallory")
    before = await _counts(store, room)
    with pytest.raises(NotFound):
        await store.inputs.accept(room, "mallory", "let me in", kind="message",
                                  idempotency_key=None)
    with pytest.raises(NotFound):
        await store.inputs.accept("no-such-room", "alice", "hello", kind="message",
                                  idempotency_key=None)
    # The refused acceptance bumped no counter and wrote no row (the check is in the
    # acceptance's own UPDATE, store/inputs.py).
    assert await _counts(store, room) == before
    accepted = await store.inputs.accept(room, "alice", "hello", kind="message",
                                         idempotency_key=None)
    assert accepted.position == 1


async def _counts(store: Store, room: str) -> tuple[int, ...]:
    async with store.engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT c.last_position, c.last_seq, "
            "(SELECT count(*) FROM accepted_inputs WHERE conversation_id = c.id), "
            "(SELECT count(*) FROM runs WHERE conversation_id = c.id), "
            "(SELECT count(*) FROM journal WHERE conversation_id = c.id) "
            "FROM conversations c WHERE c.id = :room"), {"room": room})).one()
    return tuple(int(v) for v in row)


@pytest.mark.rule("R-024", "R-025")
async def test_concurrent_claims_make_one_run_active_and_take_inputs_in_order(
    store: Store,
) -> None:
    from datetime import timedelta

    from kaizen_server_extension.store.runs import RunLane

    room = await _room(store)
    accepted = [await store.inputs.accept(room, "alice", f"m{i}", kind="message",
                                          idempotency_key=None) for i in range(3)]
    lane = RunLane(store)
    order = []
    for _ in accepted:
        # Ten claimers at once, as two replicas' lanes and recovery loops would be.
        claims = await asyncio.gather(*(lane.claim_next(room, f"claimer-{i}",
                                                        timedelta(seconds=30))
                                        for i in range(10)))
        won = [c for c in claims if c is not None]
        assert len(won) == 1
        order.append(won[0].input_position)
        # While it is active, nobody claims the room's next input.
        assert await lane.claim_next(room, "late", timedelta(seconds=30)) is None
        assert await lane.settle(won[0].id, "completed", "answered", "test",
                                 fence=won[0].fence)
    assert order == [1, 2, 3]
    assert await lane.claim_next(room, "idle", timedelta(seconds=30)) is None
