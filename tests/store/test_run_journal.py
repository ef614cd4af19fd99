"""A running turn's journal writes (store/run_journal.py): one statement on PostgreSQL, a few
on SQLite, the same rows and the same refusals either way."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.calls import HeldAudit, open_call
from kaizen_server_extension.store.records import RunRecord
from kaizen_server_extension.store.run_journal import (
    journal_while_live,
    one_statement,
    open_call_journaled,
)
from kaizen_server_extension.store.runs import RunLane
from tests.store.test_units import _published

DATA = {"text": "naïve — 東京", "nested": [1, None, True]}


async def _running(store: Store) -> RunRecord:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    room = await store.conversations.create("alice", "general", "hot path", False)
    await store.inputs.accept(room.id, "alice", "go", kind="message", idempotency_key=None)
    run = await RunLane(store).claim_next(room.id, "test", timedelta(seconds=30))
    assert run is not None
    return run


async def _audit_actions(store: Store, run_id: str) -> list[tuple[str, str]]:
    async with store.transaction() as tx:
        rows = (await tx.session.execute(
            select(m.AuditEvent.action, m.AuditEvent.actor)
            .where(m.AuditEvent.run_id == run_id, m.AuditEvent.action == "tool.call")
        )).all()
    return [(str(a), str(b)) for a, b in rows]


async def test_an_event_journaled_while_live_is_stored_published_and_counted(
    store: Store,
) -> None:
    run = await _running(store)
    published = _published(store)
    audit = [HeldAudit("alice", {"tool": "probe", "ok": True}, run.conversation_id, run.id)]
    notify = store.notifies

    conversation = await store.run(
        journal_while_live(run.id, run.fence, "tool.settled", "alice", DATA, steps=1,
                           audit=audit, notify=notify),
        single_statement=one_statement(notify, audit))

    assert conversation == run.conversation_id
    [event] = [e for e in await store.journal.read(run.conversation_id, "alice")
               if e.type == "tool.settled"]
    assert event.data == DATA and event.run_id == run.id and event.at.tzinfo is not None
    assert published == [event]
    assert await _audit_actions(store, run.id) == [("tool.call", "alice")]
    async with store.transaction() as tx:
        steps = (await tx.session.execute(
            select(m.Run.steps).where(m.Run.id == run.id))).scalar_one()
    assert steps == run.steps + 1


async def test_a_run_no_longer_ours_journals_nothing_but_keeps_the_calls_audit(
    store: Store,
) -> None:
    run = await _running(store)
    before = await store.journal.read(run.conversation_id, "alice")
    published = _published(store)
    audit = [HeldAudit("alice", {"tool": "probe"}, run.conversation_id, run.id)]
    notify = store.notifies

    stale = await store.run(
        journal_while_live(run.id, run.fence + 1, "tool.settled", "alice", DATA,
                           audit=audit, notify=notify),
        single_statement=one_statement(notify, audit))
    unopened = await store.run(
        open_call_journaled(run.id, run.fence + 1, "probe", "alice", DATA, notify=notify),
        single_statement=notify)

    assert stale is None and unopened is None
    assert await store.journal.read(run.conversation_id, "alice") == before
    assert published == []
    assert await _audit_actions(store, run.id) == [("tool.call", "alice")]


async def test_opening_a_call_reads_the_facts_open_call_reads_and_journals_the_request(
    store: Store,
) -> None:
    run = await _running(store)
    notify = store.notifies

    facts = await store.run(
        open_call_journaled(run.id, run.fence, "probe", "alice", {"name": "probe"},
                            notify=notify),
        single_statement=notify)
    opened = await store.run(open_call(run.id, run.fence, "probe"))

    assert facts is not None and opened is not None
    assert opened == (run.conversation_id, facts)
    assert facts.fence == run.fence and facts.member == "alice"
    events = await store.journal.read(run.conversation_id, "alice")
    assert [e.type for e in events].count("tool.requested") == 1
    async with store.transaction() as tx:
        calls = (await tx.session.execute(
            select(m.Run.tool_calls).where(m.Run.id == run.id))).scalar_one()
    assert calls == 2  # each opening counts, the one-statement form too


@pytest.mark.parametrize("audit_rows", [0, 1, 2])
def test_postgresql_uses_one_statement_for_at_most_one_audit_row(audit_rows: int) -> None:
    held = [HeldAudit("alice", {}, "c", "r")] * audit_rows
    assert one_statement(True, held) is (audit_rows <= 1)
    assert one_statement(False, held) is False
