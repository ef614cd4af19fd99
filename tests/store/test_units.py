"""Store units run straight on the driver (store/units.py): the same rows as through the
session, all or nothing, published only once committed, and never half-known to a cancelled
caller."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import bindparam, column, select, table, text

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import audit_insert, journal_append
from kaizen_server_extension.store.records import EventRecord
from kaizen_server_extension.store.units import CompiledStatement, Unit, fetch

DATA = {"text": "naïve — 東京", "nested": {"list": [1, 2.5, None, True]}, "empty": {}}


async def _conversation(store: Store) -> str:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    conversation = await store.conversations.create("alice", "general", "units", False)
    return conversation.id


def _published(store: Store) -> list[EventRecord]:
    seen: list[EventRecord] = []

    def listener(records: Sequence[EventRecord]) -> None:
        seen.extend(records)

    store.add_listener(listener)
    return seen


async def test_a_unit_writes_the_same_rows_as_the_session(store: Store) -> None:
    conversation = await _conversation(store)
    published = _published(store)
    direct = await store.run(journal_append(conversation, "note", "alice", DATA,
                                            run_id=None, notify=store.notifies))
    async with store.transaction() as tx:
        through_session = await tx.append_event(conversation, "note", "alice", DATA)
    assert through_session.seq == direct.seq + 1
    assert published == [direct, through_session]

    rows = await store.journal.read(conversation, "alice", limit=10)
    by_seq = {row.seq: row for row in rows}
    for record in (direct, through_session):
        stored = by_seq[record.seq]
        assert stored.data == DATA and stored.type == "note" and stored.actor == "alice"
        assert stored.at == record.at and stored.at.tzinfo is not None

    await store.run(audit_insert("alice", "unit.test", DATA, conversation_id=conversation))
    async with store.transaction() as tx:
        audit = (await tx.session.execute(
            select(m.AuditEvent).where(m.AuditEvent.action == "unit.test"))).scalar_one()
    assert audit.data == DATA and audit.conversation_id == conversation
    assert abs((datetime.now(UTC) - audit.at).total_seconds()) < 60


_JOURNAL = m.Base.metadata.tables[m.JournalEvent.__tablename__]
_DUPLICATE_SEQ = _JOURNAL.insert().values(
    conversation_id=bindparam("b_conversation_id"), seq=1, run_id=None, type="dup",
    actor="alice", at=bindparam("b_at"), data=bindparam("b_data"))


async def test_a_unit_that_fails_in_the_database_changes_and_publishes_nothing(
    store: Store,
) -> None:
    conversation = await _conversation(store)
    first = await store.run(journal_append(conversation, "first", "alice", {},
                                           run_id=None, notify=store.notifies))
    assert first.seq == 1
    published = _published(store)

    def clashing() -> Unit[None]:
        yield from journal_append(conversation, "second", "alice", {}, run_id=None,
                                  notify=store.notifies)
        # seq 1 is taken: the UNIQUE (conversation_id, seq) constraint refuses it.
        yield from fetch(_DUPLICATE_SEQ, {"b_conversation_id": conversation,
                                          "b_at": datetime.now(UTC), "b_data": {}})

    with pytest.raises(Exception, match=r"(?i)unique"):
        await store.run(clashing())
    assert published == []
    assert [e.type for e in await store.journal.read(conversation, "alice")] == ["first"]
    # Nothing was left open: the next unit takes the next seq.
    again = await store.run(journal_append(conversation, "again", "alice", {}, run_id=None,
                                           notify=store.notifies))
    assert again.seq == 2


async def test_a_unit_that_raises_half_way_is_rolled_back(store: Store) -> None:
    conversation = await _conversation(store)

    def half_way() -> Unit[None]:
        yield from journal_append(conversation, "lost", "alice", {}, run_id=None,
                                  notify=store.notifies)
        raise LookupError("changed my mind")

    with pytest.raises(LookupError):
        await store.run(half_way())
    assert await store.journal.read(conversation, "alice") == []


async def _hold_the_conversation_row(store: Store, backend: str, conversation: str,
                                     db_path: Path | None) -> Any:
    """Block the next append to ``conversation`` from outside the store; returns a release
    callable."""
    if backend == "sqlite":
        assert db_path is not None
        holder = sqlite3.connect(db_path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")

        async def release_sqlite() -> None:
            holder.execute("ROLLBACK")
            holder.close()

        return release_sqlite
    connection = await store.engine.connect()
    transaction = await connection.begin()
    await connection.execute(text("SELECT 1 FROM conversations WHERE id = :c FOR UPDATE"),
                             {"c": conversation})

    async def release_postgres() -> None:
        await transaction.rollback()
        await connection.close()

    return release_postgres


async def test_a_cancelled_caller_does_not_cut_a_unit_short(
    store: Store, backend: str, tmp_path: Path,
) -> None:
    """The unit runs to its end and is published; the caller sees only its cancellation."""
    conversation = await _conversation(store)
    published = _published(store)
    release = await _hold_the_conversation_row(store, backend, conversation,
                                               tmp_path / "kaizen.db")
    caller = asyncio.create_task(store.run(journal_append(
        conversation, "survivor", "alice", {}, run_id=None, notify=store.notifies)))
    try:
        await asyncio.sleep(0.3)  # the unit is now waiting for the held row
        assert not caller.done()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
    finally:
        await release()
    for _ in range(100):
        if published:
            break
        await asyncio.sleep(0.05)
    assert [e.type for e in published] == ["survivor"]
    assert [e.type for e in await store.journal.read(conversation, "alice")] == ["survivor"]


# --- SQLite: the loop's thread when the lock is free, the pooled connection's when not --------


def _sqlite(backend: str) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite only")


def _runner(store: Store) -> Any:
    return store._units  # the runner's counters are what these tests observe


async def test_a_unit_waits_for_a_lock_held_by_another_process_instead_of_failing(
    store: Store, backend: str, tmp_path: Path,
) -> None:
    _sqlite(backend)
    conversation = await _conversation(store)
    on_loop = _runner(store).loop_thread_units
    await store.run(journal_append(conversation, "free", "alice", {}, run_id=None,
                                   notify=False))
    assert _runner(store).loop_thread_units == on_loop + 1

    holder = sqlite3.connect(tmp_path / "kaizen.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    waiting = asyncio.create_task(store.run(journal_append(
        conversation, "waited", "alice", {}, run_id=None, notify=False)))
    started = time.monotonic()
    await asyncio.sleep(0.3)
    # Waiting on the pooled connection's thread; the event loop itself never waited.
    assert time.monotonic() - started < 1.0
    assert not waiting.done()
    holder.execute("ROLLBACK")
    holder.close()
    assert (await asyncio.wait_for(waiting, 15)).seq == 2
    assert _runner(store).loop_thread_units == on_loop + 1


async def test_sessions_and_units_interleave_without_losing_or_doubling_a_seq(
    store: Store,
) -> None:
    conversation = await _conversation(store)

    async def by_unit(i: int) -> int:
        record = await store.run(journal_append(conversation, f"u{i}", "alice", {},
                                                run_id=None, notify=store.notifies))
        return record.seq

    async def by_session(i: int) -> int:
        async with store.transaction() as tx:
            await asyncio.sleep(0)  # hold the transaction across a loop iteration
            record = await tx.append_event(conversation, f"s{i}", "alice", {})
        return record.seq

    seqs = await asyncio.gather(*(
        (by_unit if i % 2 else by_session)(i) for i in range(60)))
    assert sorted(seqs) == list(range(1, 61))
    stored = await store.journal.read(conversation, "alice", limit=100)
    assert [e.seq for e in stored] == list(range(1, 61))


async def test_the_loop_connection_leaves_checkpoints_to_the_pooled_one(
    store: Store, backend: str, tmp_path: Path,
) -> None:
    """A checkpoint syncs the database file, which must not happen on the event loop: the
    units' own connection never checkpoints, and every CHECKPOINT_EVERY units the pooled
    connection is asked to."""
    _sqlite(backend)
    conversation = await _conversation(store)
    runner = _runner(store)
    runner.CHECKPOINT_EVERY = 10
    db_file = tmp_path / "kaizen.db"

    def main_file() -> bytes:
        return db_file.read_bytes()

    for i in range(5):  # fewer than CHECKPOINT_EVERY since the connection opened
        await store.run(journal_append(conversation, f"e{i}", "alice", {}, run_id=None,
                                       notify=False))
    before = main_file()
    for i in range(4):
        await store.run(journal_append(conversation, f"f{i}", "alice", {}, run_id=None,
                                       notify=False))
    assert main_file() == before  # only the WAL grew
    assert runner._loop_db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    await store.run(journal_append(conversation, "tenth", "alice", {}, run_id=None,
                                   notify=False))
    assert runner._checkpointing is not None
    await runner._checkpointing
    assert main_file() != before


def test_statements_with_parameters_rendered_per_execution_are_refused() -> None:
    from sqlalchemy.dialects.sqlite import aiosqlite as sqlite_dialect

    expanding = select(column("a")).select_from(table("t")).where(
        column("a").in_(bindparam("values", expanding=True)))
    with pytest.raises(ValueError, match="positional"):
        CompiledStatement.of(expanding, sqlite_dialect.dialect())


def test_aiosqlite_still_offers_what_the_sqlite_runner_uses() -> None:
    """SQLiteRunner queues a function on aiosqlite's connection thread (``_execute``) and
    hands it the sqlite3 connection (``_conn``); a release that drops either must fail here,
    not in a turn."""
    assert callable(getattr(aiosqlite.Connection, "_execute", None))
    assert isinstance(aiosqlite.Connection.__dict__.get("_conn"), property)


# --- PostgreSQL only -----------------------------------------------------------------------


def _postgres(backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("PostgreSQL only")


_SHOW_SYNCHRONOUS_COMMIT = text("SHOW synchronous_commit")
_BACKEND_PID = text("SELECT pg_backend_pid()")


def _scalar(clause: Any) -> Unit[Any]:
    rows = yield from fetch(clause, {})
    return rows[0][0]


async def test_a_unit_that_need_not_be_durable_relaxes_only_its_own_commit(
    store: Store, backend: str,
) -> None:
    _postgres(backend)
    assert await store.run(_scalar(_SHOW_SYNCHRONOUS_COMMIT), durable=False) == "off"
    # The same pooled connection (one caller at a time) is back to the server's default.
    assert await store.run(_scalar(_SHOW_SYNCHRONOUS_COMMIT)) == "on"


async def test_a_read_only_unit_cannot_write(store: Store, backend: str) -> None:
    _postgres(backend)
    conversation = await _conversation(store)
    with pytest.raises(Exception, match=r"(?i)read-only"):
        await store.run(journal_append(conversation, "x", "alice", {}, run_id=None,
                                       notify=True), write=False)
    assert await store.journal.read(conversation, "alice") == []


async def test_a_pooled_connection_the_server_dropped_is_replaced(
    store: Store, backend: str,
) -> None:
    _postgres(backend)
    first = await store.run(_scalar(_BACKEND_PID))
    async with store.engine.begin() as connection:
        await connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
    await asyncio.sleep(0.2)
    second = await store.run(_scalar(_BACKEND_PID))
    assert second != first
