"""A running turn's journal writes, each one unit: while the run is still ours, append the
event (and, for a settled call, its audit row); open a tool call and journal its request.

These are the turn's hot path: a model step writes one, a tool call two (host/run_host.py).
On SQLite each is a few statements in one BEGIN IMMEDIATE … COMMIT on the event loop's
thread. On PostgreSQL each is **one statement** (data-modifying CTEs: the liveness UPDATE on
the run, the conversation's ``seq`` bump, the journal insert, the NOTIFY, the audit insert),
run as its own implicit transaction: one round trip instead of BEGIN, two or three
statements and COMMIT, each a round trip to a database on the same small machine
(bench/README.md, ``e2e_overhead``). The rows written are the same either way, and so are
the guarantees: the run's row is locked by the liveness UPDATE before the conversation's,
the UNIQUE (conversation_id, seq) holds, NOTIFY is delivered exactly when the event commits,
and a call's audit row is written whether or not the run is still ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, Text, bindparam, cast, func, insert, literal, select, true, update
from sqlalchemy.sql.selectable import CTE

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.calls import (
    _OPEN_CALL,
    CallFacts,
    HeldAudit,
    audit_rows,
    call_facts_of,
    open_call,
)
from kaizen_server_extension.store.core import JOURNAL_CHANNEL, journal_append, utcnow
from kaizen_server_extension.store.records import EventRecord
from kaizen_server_extension.store.runs import _CHECK_LIVE, live_conversation
from kaizen_server_extension.store.storable import storable_document
from kaizen_server_extension.store.units import Appended, Unit, fetch

_TABLES = m.Base.metadata.tables
_CONVERSATIONS = _TABLES[m.Conversation.__tablename__]
_JOURNAL = _TABLES[m.JournalEvent.__tablename__]
_AUDIT = _TABLES[m.AuditEvent.__tablename__]
_EVENT_COLUMNS = ["conversation_id", "seq", "run_id", "type", "actor", "at", "data"]
_AUDIT_COLUMNS = ["at", "actor", "action", "data", "conversation_id", "run_id"]


def _param(name: str, column: Any) -> Any:
    return bindparam(name, type_=column.type)


def _appended_after(source: CTE, name: str) -> CTE:
    """The journal append to the conversation ``source`` (a CTE with a ``conversation_id``
    column and at most one row) names: its ``seq`` bumped, the event inserted."""
    bumped = (update(_CONVERSATIONS)
              .where(_CONVERSATIONS.c.id == select(source.c.conversation_id).scalar_subquery())
              .values(last_seq=_CONVERSATIONS.c.last_seq + 1, updated_at=bindparam("b_now"))
              .returning(_CONVERSATIONS.c.id, _CONVERSATIONS.c.last_seq)
              .cte(f"{name}_bumped"))
    return (insert(_JOURNAL)
            .from_select(_EVENT_COLUMNS, select(
                bumped.c.id, bumped.c.last_seq, _param("b_run_id", _JOURNAL.c.run_id),
                _param("b_type", _JOURNAL.c.type), _param("b_actor", _JOURNAL.c.actor),
                _param("b_at", _JOURNAL.c.at), _param("b_data", _JOURNAL.c.data)))
            .returning(_JOURNAL.c.conversation_id, _JOURNAL.c.seq)
            .add_cte(bumped)
            .cte(f"{name}_journaled"))


def _notify(journaled: CTE) -> Any:
    return func.pg_notify(literal(JOURNAL_CHANNEL, Text), cast(func.json_build_object(
        literal("n", Text), func.current_schema(), literal("c", Text),
        journaled.c.conversation_id, literal("s", Text), journaled.c.seq), Text))


# An audit row of a settled call, written by the same statement when ``b_with_audit``: a
# data-modifying CTE runs whether or not the statement's result reads it, so the row is
# written even when the run is no longer ours (the call happened all the same).
_AUDITED = (insert(_AUDIT)
            .from_select(_AUDIT_COLUMNS, select(
                _param("b_at", _AUDIT.c.at), _param("b_audit_actor", _AUDIT.c.actor),
                literal("tool.call", _AUDIT.c.action.type),
                _param("b_audit_data", _AUDIT.c.data),
                _param("b_audit_conversation_id", _AUDIT.c.conversation_id),
                _param("b_audit_run_id", _AUDIT.c.run_id))
                .where(bindparam("b_with_audit", type_=Boolean)))
            .cte("audited"))

_LIVE = _CHECK_LIVE.cte("live")
_LIVE_JOURNALED = _appended_after(_LIVE, "live")
_JOURNAL_WHILE_LIVE = (select(_LIVE_JOURNALED.c.conversation_id, _LIVE_JOURNALED.c.seq,
                              _notify(_LIVE_JOURNALED))
                       .add_cte(_LIVE, _LIVE_JOURNALED, _AUDITED))

_OPENED = _OPEN_CALL.cte("opened")
_OPENED_JOURNALED = _appended_after(_OPENED, "opened")
_OPEN_AND_JOURNAL = (select(*_OPENED.c, _OPENED_JOURNALED.c.seq, _notify(_OPENED_JOURNALED))
                     .select_from(_OPENED.join(_OPENED_JOURNALED, true()))
                     .add_cte(_OPENED, _OPENED_JOURNALED))


def one_statement(notify: bool, audit: Sequence[HeldAudit] = ()) -> bool:
    """Whether :func:`journal_while_live` is one statement (PostgreSQL, at most one audit
    row): run it with ``single_statement``."""
    return notify and len(audit) <= 1


def journal_while_live(run_id: str, fence: int, kind: str, actor: str, data: dict[str, Any],
                       *, steps: int = 0, audit: Sequence[HeldAudit] = (),
                       notify: bool) -> Unit[str | None]:
    """Journal ``kind`` while the run is ours (active, at ``fence``), counting ``steps``;
    the run's conversation id, or None (nothing journaled) when it is not. ``audit`` rows
    are written either way."""
    if not one_statement(notify, audit):
        conversation = yield from live_conversation(run_id, fence, steps=steps)
        if conversation is not None:
            yield from journal_append(conversation, kind, actor, data, run_id=run_id,
                                      notify=notify)
        yield from audit_rows(list(audit))
        return conversation
    data = storable_document(data)
    now = utcnow()
    held = audit[0] if audit else None
    rows = yield from fetch(_JOURNAL_WHILE_LIVE, {
        "b_run_id": run_id, "b_fence": fence, "b_steps": steps, "b_tool_calls": 0,
        "b_now": now, "b_type": kind, "b_actor": actor, "b_at": now, "b_data": data,
        "b_with_audit": held is not None,
        "b_audit_actor": held.actor if held else None,
        "b_audit_data": held.data if held else None,
        "b_audit_conversation_id": held.conversation_id if held else None,
        "b_audit_run_id": held.run_id if held else None})
    if not rows:
        return None
    conversation, seq = rows[0][0], rows[0][1]
    yield Appended(EventRecord(conversation, seq, run_id, kind, actor, now, data))
    return str(conversation)


def open_call_journaled(run_id: str, fence: int, tool: str, actor: str,
                        data: dict[str, Any], *, notify: bool) -> Unit[CallFacts | None]:
    """Open a call of ``tool`` while the run is ours and journal its ``tool.requested``:
    the facts the call's checks re-resolve at call time (store/calls.py), or None (nothing
    written) when the run is no longer ours. One statement on PostgreSQL (``notify``)."""
    if not notify:
        opened = yield from open_call(run_id, fence, tool)
        if opened is None:
            return None
        conversation, facts = opened
        yield from journal_append(conversation, "tool.requested", actor, data, run_id=run_id,
                                  notify=notify)
        return facts
    data = storable_document(data)
    now = utcnow()
    rows = yield from fetch(_OPEN_AND_JOURNAL, {
        "b_run_id": run_id, "b_fence": fence, "b_tool": tool, "b_now": now,
        "b_type": "tool.requested", "b_actor": actor, "b_at": now, "b_data": data})
    if not rows:
        return None
    *returned, seq, _notified = rows[0]
    conversation, facts = call_facts_of(run_id, tool, tuple(returned))
    yield Appended(EventRecord(conversation, seq, run_id, "tool.requested", actor, now, data))
    return facts
