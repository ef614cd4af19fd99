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
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Text,
    bindparam,
    cast,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)
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
from kaizen_server_extension.store.storable import storable_document
from kaizen_server_extension.store.units import Appended, Unit, fetch

ACTIVE = m.ACTIVE_RUN_STATUSES
OPEN = ("queued", *m.ACTIVE_RUN_STATUSES)

_TABLES = m.Base.metadata.tables
_RUNS = _TABLES[m.Run.__tablename__]
# Spelled as plain comparisons: an IN list is an "expanding" parameter that SQLAlchemy
# re-renders into the SQL text on every execution.
_ACTIVE_STATUS = or_(*(_RUNS.c.status == status for status in ACTIVE))
_CONVERSATIONS = _TABLES[m.Conversation.__tablename__]
_JOURNAL = _TABLES[m.JournalEvent.__tablename__]
_AUDIT = _TABLES[m.AuditEvent.__tablename__]
_EVENT_COLUMNS = ["conversation_id", "seq", "run_id", "type", "actor", "at", "data"]
_AUDIT_COLUMNS = ["at", "actor", "action", "data", "conversation_id", "run_id"]


# Every journal write of a run goes through this, so it is built once (a Core statement on the
# table: no ORM update evaluation) and reused with fresh parameters.
_CHECK_LIVE = (
    update(_RUNS)
    .where(_RUNS.c.id == bindparam("b_run_id"), _RUNS.c.fence == bindparam("b_fence"),
           _ACTIVE_STATUS)
    .values(steps=_RUNS.c.steps + bindparam("b_steps"),
            tool_calls=_RUNS.c.tool_calls + bindparam("b_tool_calls"))
    .returning(_RUNS.c.conversation_id)
)


def live_conversation(run_id: str, fence: int, *, steps: int = 0,
                      tool_calls: int = 0) -> Unit[str | None]:
    """The run's conversation id while it is still ours (active, at ``fence``), counting
    ``steps`` and ``tool_calls``; else None, changing nothing.

    The UPDATE also locks the row on PostgreSQL, so a cancel cannot slip in between this
    check and the journal write that follows it in the same transaction.
    """
    rows = yield from fetch(_CHECK_LIVE, {"b_run_id": run_id, "b_fence": fence,
                                          "b_steps": steps, "b_tool_calls": tool_calls})
    return rows[0][0] if rows else None


_ADMIT = (update(_RUNS)
          .where(_RUNS.c.id == bindparam("b_run_id"), _RUNS.c.fence == bindparam("b_fence"),
                 _ACTIVE_STATUS)
          .values(agent_version_id=bindparam("b_agent_version_id"),
                  audience_version=bindparam("b_audience_version"),
                  resource_digest=bindparam("b_resource_digest"),
                  catalog_digest=bindparam("b_catalog_digest"), model=bindparam("b_model"))
          .returning(_RUNS.c.conversation_id, _RUNS.c.member))



_SETTLE_VALUES: dict[str, Any] = {"status": bindparam("b_status"), "reason": bindparam("b_reason"),
                  "settled_at": bindparam("b_now"), "lease_owner": None,
                  "lease_expires_at": None}
_OPEN_STATUS = or_(*(_RUNS.c.status == status for status in OPEN))
_SETTLE = (update(_RUNS).where(_RUNS.c.id == bindparam("b_run_id"), _OPEN_STATUS)
           .values(**_SETTLE_VALUES).returning(_RUNS.c.conversation_id))
_SETTLE_AT_FENCE = (update(_RUNS).where(_RUNS.c.id == bindparam("b_run_id"), _OPEN_STATUS,
                                        _RUNS.c.fence == bindparam("b_fence"))
                    .values(**_SETTLE_VALUES).returning(_RUNS.c.conversation_id))



@dataclass(frozen=True, slots=True)
class Admission:
    """The authority bundle columns written when a claimed run is admitted."""

    agent_version_id: str
    audience_version: int
    resource_digest: str
    catalog_digest: str
    model: str | None


def _param(name: str, column: Any) -> Any:
    return bindparam(name, type_=column.type)


def _appended_after(source: CTE, name: str, actor: Any = None) -> CTE:
    """The journal append to the conversation ``source`` (a CTE with a ``conversation_id``
    column and at most one row) names: its ``seq`` bumped, the event inserted; its actor
    ``b_actor``, or ``actor``, a column of ``source``."""
    bumped = (update(_CONVERSATIONS)
              .where(_CONVERSATIONS.c.id == select(source.c.conversation_id).scalar_subquery())
              .values(last_seq=_CONVERSATIONS.c.last_seq + 1, updated_at=bindparam("b_now"))
              .returning(_CONVERSATIONS.c.id, _CONVERSATIONS.c.last_seq)
              .cte(f"{name}_bumped"))
    return (insert(_JOURNAL)
            .from_select(_EVENT_COLUMNS, select(
                bumped.c.id, bumped.c.last_seq, _param("b_run_id", _JOURNAL.c.run_id),
                _param("b_type", _JOURNAL.c.type),
                _param("b_actor", _JOURNAL.c.actor) if actor is None else actor,
                _param("b_at", _JOURNAL.c.at), _param("b_data", _JOURNAL.c.data)))
            .returning(_JOURNAL.c.conversation_id, _JOURNAL.c.seq, _JOURNAL.c.actor)
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

def _journaled_after(source_update: Any, name: str, actor: str | None = None) -> Any:
    """One statement: ``source_update`` (an UPDATE of a run returning its
    ``conversation_id``), then the journal append it allows, and the NOTIFY."""
    source = source_update.cte(name)
    journaled = _appended_after(source, name, None if actor is None else source.c[actor])
    return (select(journaled.c.conversation_id, journaled.c.seq, journaled.c.actor,
                   _notify(journaled))
            .add_cte(source, journaled))


_SETTLING = _journaled_after(_SETTLE, "settling")
_SETTLING_AT_FENCE = _journaled_after(_SETTLE_AT_FENCE, "settling")
_ADMITTING = _journaled_after(_ADMIT, "admitting", actor="member")

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


def settled(run_id: str, status: str, reason: str, actor: str, *, fence: int | None,
            data: dict[str, Any] | None, notify: bool) -> Unit[bool]:
    """Compare-and-set the run's one terminal status (while it is still open, and at
    ``fence`` when given) and journal ``run.terminal`` with it; False when another outcome
    won, changing nothing. One statement on PostgreSQL (``notify``)."""
    if status not in m.TERMINAL_RUN_STATUSES:
        raise ValueError(f"not a terminal status: {status}")
    now = utcnow()
    params = {"b_run_id": run_id, "b_status": status, "b_reason": reason, "b_now": now,
              "b_fence": fence}
    event = {"status": status, "reason": reason, **(data or {})}
    if not notify:
        rows = yield from fetch(_SETTLE if fence is None else _SETTLE_AT_FENCE, params)
        if not rows:
            return False
        yield from journal_append(rows[0][0], "run.terminal", actor, event, run_id=run_id,
                                  notify=notify)
        return True
    event = storable_document(event)
    rows = yield from fetch(_SETTLING if fence is None else _SETTLING_AT_FENCE, {
        **params, "b_type": "run.terminal", "b_actor": actor, "b_at": now, "b_data": event})
    if not rows:
        return False
    yield Appended(EventRecord(rows[0][0], rows[0][1], run_id, "run.terminal", actor, now,
                               event))
    return True


def admitted(run_id: str, fence: int, admission: Admission, event_data: dict[str, Any], *,
             notify: bool) -> Unit[bool]:
    """The run's authority bundle written, if it is still ours at ``fence``, and
    ``run.admitted`` journaled with it (its member the actor); False (nothing written)
    otherwise. One statement on PostgreSQL (``notify``)."""
    params = {"b_run_id": run_id, "b_fence": fence,
              "b_agent_version_id": admission.agent_version_id,
              "b_audience_version": admission.audience_version,
              "b_resource_digest": admission.resource_digest,
              "b_catalog_digest": admission.catalog_digest, "b_model": admission.model}
    if not notify:
        rows = yield from fetch(_ADMIT, params)
        if not rows:
            return False
        conversation_id, member = rows[0]
        yield from journal_append(conversation_id, "run.admitted", member, event_data,
                                  run_id=run_id, notify=notify)
        return True
    event = storable_document(event_data)
    now = utcnow()
    rows = yield from fetch(_ADMITTING, {**params, "b_now": now, "b_type": "run.admitted",
                                         "b_at": now, "b_data": event})
    if not rows:
        return False
    yield Appended(EventRecord(rows[0][0], rows[0][1], run_id, "run.admitted", rows[0][2],
                               now, event))
    return True


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
