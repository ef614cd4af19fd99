"""Acceptances written in batches (PostgreSQL; store/accept_batch.py): a burst keeps every
guarantee of one acceptance at a time: gap-free positions and seqs in arrival order, the
participant check, the idempotency key's answers, durability before the answer, and one bad
input never fails the others. On SQLite the same calls take one acceptance at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import select, text

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.store import Store, create_engine
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.records import AcceptedInputRecord, EventRecord
from kaizen_server_extension.store.units import Unit, fetch
from tests.conftest import POSTGRES_URL


async def _room(store: Store, owner: str = "alice") -> str:
    await store.members.ensure(owner)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    conversation = await store.conversations.create(owner, "general", "room", False)
    return conversation.id


def _send(store: Store, room: str, text: str, key: str | None = None,
          member: str = "alice") -> asyncio.Task[AcceptedInputRecord]:
    return asyncio.ensure_future(store.inputs.accept(room, member, text, kind="message",
                                                     idempotency_key=key))


async def _journal(store: Store, room: str) -> list[EventRecord]:
    return await store.journal.read(room, "alice", limit=1000)


def _batcher_counts(store: Store) -> tuple[int, int]:
    batcher = store.inputs.batcher()
    return batcher.batches, batcher.inputs


async def _inputs(store: Store, room: str) -> Sequence[m.AcceptedInput]:
    async with store.transaction() as tx:
        return (await tx.session.execute(
            select(m.AcceptedInput).where(m.AcceptedInput.conversation_id == room)
            .order_by(m.AcceptedInput.position))).scalars().all()


@pytest.mark.rule("R-024")
async def test_a_burst_into_one_room_takes_positions_in_arrival_order(store: Store) -> None:
    room = await _room(store)
    accepted = await asyncio.gather(*[_send(store, room, f"m{i}") for i in range(60)])
    # Sent in this order, so accepted in this order: the room's FIFO is the arrival order.
    assert [a.position for a in accepted] == list(range(1, 61))
    events = await _journal(store, room)
    assert [e.seq for e in events] == list(range(1, 61))
    assert [(e.data["input_id"], e.data["position"], e.data["text"]) for e in events] == [
        (a.input_id, a.position, f"m{i}") for i, a in enumerate(accepted)]
    assert all(e.type == "input.accepted" and e.data["audience_version"] == 1
               for e in events)
    stored = await _inputs(store, room)
    assert [(i.id, i.position) for i in stored] == [(a.input_id, a.position) for a in accepted]
    if store.notifies:
        batches, inputs = _batcher_counts(store)
        # The first went alone; the rest waited for it and went together.
        assert inputs == 60 and batches < 10


@pytest.mark.rule("R-024")
async def test_a_burst_over_rooms_numbers_each_room_on_its_own(store: Store) -> None:
    rooms = [await _room(store) for _ in range(5)]
    sends = [(rooms[i % 5], f"m{i}") for i in range(40)]
    accepted = await asyncio.gather(*[_send(store, room, text) for room, text in sends])
    for room in rooms:
        mine = [a for a in accepted if a.conversation_id == room]
        assert [a.position for a in mine] == list(range(1, 9))
        events = await _journal(store, room)
        assert [e.seq for e in events] == list(range(1, 9))
        assert [e.data["input_id"] for e in events] == [a.input_id for a in mine]


async def test_steering_in_a_burst_carries_its_members_model(store: Store) -> None:
    room = await _room(store)
    await store.members.update_settings("alice", approval_mode="ask_for_writes",
                                        model="alices-model")
    sends = [asyncio.ensure_future(store.inputs.accept(
        room, "alice", f"m{i}", kind="steering" if i % 2 else "message",
        idempotency_key=None)) for i in range(6)]
    accepted = await asyncio.gather(*sends)
    assert [a.kind for a in accepted] == ["message", "steering"] * 3
    stored = await _inputs(store, room)
    assert [(i.kind, i.model) for i in stored] == [
        ("message", None), ("steering", "alices-model")] * 3
    assert [e.type for e in await _journal(store, room)] == [
        "input.accepted", "steering.accepted"] * 3


async def test_a_key_used_twice_in_one_burst_answers_the_first(store: Store) -> None:
    room = await _room(store)
    first, others, replay, reused = await asyncio.gather(
        _send(store, room, "hello", key="k"),
        asyncio.gather(*[_send(store, room, f"m{i}") for i in range(5)]),
        _send(store, room, "hello", key="k"),
        _send(store, room, "something else", key="k"),
        return_exceptions=True)
    assert isinstance(others, list)
    keyed = [first, replay, reused]
    written = [r for r in keyed if isinstance(r, AcceptedInputRecord) and r.created]
    assert len(written) == 1
    # Every other answer is that acceptance replayed, or a conflict: nothing else written.
    assert all(r.input_id == written[0].input_id for r in keyed
               if isinstance(r, AcceptedInputRecord))
    assert all(isinstance(r, AcceptedInputRecord | Conflict) for r in keyed)
    assert sorted([written[0].position, *(o.position for o in others)]) == list(range(1, 7))
    assert [e.seq for e in await _journal(store, room)] == list(range(1, 7))
    if store.notifies:  # batched: taken in arrival order, so the first one sent wins
        assert isinstance(first, AcceptedInputRecord) and first.created
        assert isinstance(replay, AcceptedInputRecord) and not replay.created
        assert (replay.run_id, replay.position) == (first.run_id, first.position)
        assert isinstance(reused, Conflict) and reused.code == "idempotency_key_reused"


async def test_a_stored_key_is_answered_as_a_replay_inside_a_burst(store: Store) -> None:
    room = await _room(store)
    first = await store.inputs.accept(room, "alice", "hello", kind="message",
                                      idempotency_key="k")
    replay, reused, *others = await asyncio.gather(
        _send(store, room, "hello", key="k"), _send(store, room, "other", key="k"),
        *[_send(store, room, f"m{i}") for i in range(4)], return_exceptions=True)
    assert isinstance(replay, AcceptedInputRecord)
    assert (replay.input_id, replay.created) == (first.input_id, False)
    assert isinstance(reused, Conflict)
    assert [o.position for o in others if isinstance(o, AcceptedInputRecord)] == [2, 3, 4, 5]


async def test_a_non_participant_in_a_burst_is_refused_alone(store: Store) -> None:
    room = await _room(store)
    await store.members.ensure("mallory")
    results = await asyncio.gather(
        _send(store, room, "a"), _send(store, room, "let me in", member="mallory"),
        _send(store, "no-such-room", "b"), _send(store, room, "c"),
        _send(store, room, "let me in", key="m-key", member="mallory"),
        return_exceptions=True)
    ok = [r for r in results if isinstance(r, AcceptedInputRecord)]
    assert [r.position for r in ok] == [1, 2]
    assert [type(r) for r in results[1:3]] == [NotFound, NotFound]
    assert isinstance(results[4], NotFound)  # a key changes nothing for a stranger
    assert [e.data["text"] for e in await _journal(store, room)] == ["a", "c"]


@pytest.mark.skipif(not POSTGRES_URL, reason="PostgreSQL only (SQLite has no length limit)")
async def test_an_input_the_database_refuses_does_not_fail_its_batch(store: Store) -> None:
    if not store.notifies:
        pytest.skip("batches are PostgreSQL's")
    room = await _room(store)
    # idempotency_key is VARCHAR(200): the batch statement is refused as a whole, and then
    # each input is accepted alone, so only the bad one fails.
    results = await asyncio.gather(
        *[_send(store, room, f"m{i}") for i in range(3)],
        _send(store, room, "too long a key", key="k" * 300),
        *[_send(store, room, f"n{i}") for i in range(3)], return_exceptions=True)
    assert isinstance(results[3], asyncpg.StringDataRightTruncationError)
    ok = [r for r in results if isinstance(r, AcceptedInputRecord)]
    assert sorted(r.position for r in ok) == list(range(1, 7))
    assert len(await _inputs(store, room)) == 6


@pytest.mark.skipif(not POSTGRES_URL, reason="PostgreSQL only")
async def test_a_batch_is_answered_and_published_only_once_its_statement_is_on_disk(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch goes through the statement whose return means "on disk"; its senders and
    observers hear of it only after that."""
    if not store.notifies:
        pytest.skip("batches are PostgreSQL's")
    room = await _room(store)
    published: list[EventRecord] = []
    store.add_listener(published.extend)
    returned = asyncio.Event()
    release = asyncio.Event()
    flushed_statement = store.run_flushed_statement

    async def held(unit: Any) -> Any:
        result = await flushed_statement(unit)
        returned.set()
        await release.wait()
        return result

    monkeypatch.setattr(store, "run_flushed_statement", held)
    sends = [_send(store, room, f"m{i}") for i in range(5)]
    await asyncio.wait_for(returned.wait(), 30)
    assert len(await _inputs(store, room)) >= 1  # committed
    assert not any(s.done() for s in sends) and published == []
    release.set()
    accepted = await asyncio.gather(*sends)
    assert [a.position for a in accepted] == [1, 2, 3, 4, 5]
    assert [e.seq for e in published] == [1, 2, 3, 4, 5]


def _synchronous_commit() -> Unit[str]:
    rows = yield from fetch(text("SELECT current_setting('synchronous_commit')"), {})
    return str(rows[0][0])


@pytest.mark.skipif(not POSTGRES_URL, reason="PostgreSQL only")
async def test_the_flushed_statement_commits_as_the_database_says_not_asynchronously(
        store: Store) -> None:
    """Unit-pool statements commit with ``synchronous_commit`` off (a WAL barrier follows
    when they must be durable); the flushed statement's commit waits for the flush itself."""
    if not store.notifies:
        pytest.skip("PostgreSQL's")
    async with store.engine.connect() as connection:
        default = (await connection.exec_driver_sql("SHOW synchronous_commit")).scalar_one()
    assert default != "off"
    assert await store.run_flushed_statement(_synchronous_commit()) == default
    assert await store.run(_synchronous_commit(), single_statement=True) == "off"


@pytest.mark.skipif(not POSTGRES_URL, reason="PostgreSQL only")
@pytest.mark.rule("R-024", "R-027")
async def test_two_processes_batching_into_shared_rooms_keep_every_guarantee(
        store: Store, backend: str, tmp_path: Path) -> None:
    """Two stores on one schema stand for two replicas: their batches lock shared rooms in
    one order (no deadlock, so no batch is refused), a key both send is written once, and
    every room stays gap-free."""
    if backend != "postgresql":
        pytest.skip("two processes share PostgreSQL only")
    rooms = [await _room(store) for _ in range(4)]
    async with _second_store(store) as other:
        sends = []
        for i in range(48):
            for which, room in ((store, rooms[i % 4]), (other, rooms[-1 - i % 4])):
                sends.append(_send(which, room, f"m{i}"))
        sends += [_send(store, rooms[0], "once", key="both"),
                  _send(other, rooms[0], "once", key="both")]
        accepted = await asyncio.gather(*sends)
        assert other.inputs.batcher().refused + store.inputs.batcher().refused <= 1
    once = accepted[-2:]
    assert once[0].input_id == once[1].input_id and sorted(
        a.created for a in once) == [False, True]
    for room in rooms:
        positions = sorted({a.position for a in accepted if a.conversation_id == room})
        assert positions == list(range(1, len(positions) + 1))
        events = await _journal(store, room)
        assert [e.seq for e in events] == list(range(1, len(positions) + 1))


@pytest.mark.skipif(not POSTGRES_URL, reason="PostgreSQL only")
async def test_a_cancelled_sender_does_not_undo_its_batch(store: Store) -> None:
    if not store.notifies:
        pytest.skip("batches are PostgreSQL's")
    room = await _room(store)
    published: list[EventRecord] = []
    store.add_listener(published.extend)
    sends = [_send(store, room, f"m{i}") for i in range(4)]
    await asyncio.sleep(0)
    sends[1].cancel()
    await asyncio.gather(*sends, return_exceptions=True)
    await asyncio.sleep(0.2)
    # The cancelled one was written with the others (its sender may retry with a key).
    assert [i.position for i in await _inputs(store, room)] == [1, 2, 3, 4]
    assert [e.seq for e in published] == [1, 2, 3, 4]


@contextlib.asynccontextmanager
async def _second_store(store: Store) -> AsyncIterator[Store]:
    """Another store on ``store``'s schema: another process, as far as batching goes."""
    async with store.engine.connect() as conn:
        schema = str((await conn.exec_driver_sql("SELECT current_schema()")).scalar_one())
    other = Store(create_engine(POSTGRES_URL, schema=schema))
    try:
        yield other
    finally:
        await other.dispose()
