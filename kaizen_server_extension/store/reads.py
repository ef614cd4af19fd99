"""The records read most, as read-only units: every turn's admission and most REST requests.

Through a session each of these reads cost a transaction with the SQLite writer gate and
``BEGIN IMMEDIATE``, several hops to aiosqlite's thread and SQLAlchemy's ORM loading (on
PostgreSQL a pre-ping and BEGIN … COMMIT around it): together the largest part of a turn's
CPU outside the model exchange (bench/README.md, ``e2e_overhead``). As units
(:meth:`Database.read <kaizen_server_extension.store.core.Database.read>`) they are Core
statements built once, run on the loop thread's SQLite connection without the gate, or on
PostgreSQL as one statement per round trip; the records are the same as the repositories'
(tests/store/test_reads.py holds them equal on both databases).

A unit here may also run inside an open transaction (``Tx.run``), where it reads that
transaction's own writes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam, exists, or_, select

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.records import (
    AgentRecord,
    ConversationRecord,
    EventRecord,
    MemberRecord,
    RunRecord,
)
from kaizen_server_extension.store.storable import restore
from kaizen_server_extension.store.units import Unit, select_rows

_TABLES = m.Base.metadata.tables
_CONVERSATIONS = _TABLES[m.Conversation.__tablename__]
_PARTICIPANTS = _TABLES[m.Participant.__tablename__]
_RUNS = _TABLES[m.Run.__tablename__]
_INPUTS = _TABLES[m.AcceptedInput.__tablename__]
_AGENTS = _TABLES[m.Agent.__tablename__]
_VERSIONS = _TABLES[m.AgentVersion.__tablename__]
_MEMBERS = _TABLES[m.Member.__tablename__]
_JOURNAL = _TABLES[m.JournalEvent.__tablename__]
_FIRINGS = _TABLES[m.TaskFiring.__tablename__]

_ACTIVE = or_(*(_RUNS.c.status == status for status in m.ACTIVE_RUN_STATUSES))

# --- conversations ------------------------------------------------------------------------

_CONVERSATION_COLUMNS = (_CONVERSATIONS.c.id, _CONVERSATIONS.c.owner, _CONVERSATIONS.c.agent_id,
                         _CONVERSATIONS.c.title, _CONVERSATIONS.c.shared,
                         _CONVERSATIONS.c.audience_version, _CONVERSATIONS.c.last_seq,
                         _CONVERSATIONS.c.created_at, _CONVERSATIONS.c.updated_at)
_CONVERSATION = select(*_CONVERSATION_COLUMNS).where(
    _CONVERSATIONS.c.id == bindparam("b_conversation_id"))
# A participant's view: anyone else finds nothing (NotFound, never 403).
_CONVERSATION_FOR = _CONVERSATION.where(exists().where(
    _PARTICIPANTS.c.conversation_id == _CONVERSATIONS.c.id,
    _PARTICIPANTS.c.member_id == bindparam("b_member")))
_PARTICIPANT_IDS = (select(_PARTICIPANTS.c.member_id)
                    .where(_PARTICIPANTS.c.conversation_id == bindparam("b_conversation_id"))
                    .order_by(_PARTICIPANTS.c.added_at, _PARTICIPANTS.c.member_id))
_ACTIVE_RUN = (select(_RUNS.c.id, _RUNS.c.status)
               .where(_RUNS.c.conversation_id == bindparam("b_conversation_id"), _ACTIVE)
               .limit(1))


def conversation_record(conversation_id: str,
                        member: str | None = None) -> Unit[ConversationRecord | None]:
    """The conversation with its participants and active run; with ``member``, only if
    that member takes part in it. None when there is no such conversation (for them)."""
    params = {"b_conversation_id": conversation_id, "b_member": member}
    rows = yield from select_rows(_CONVERSATION if member is None else _CONVERSATION_FOR,
                                  params)
    if not rows:
        return None
    (id_, owner, agent_id, title, shared, audience_version, last_seq, created_at,
     updated_at) = rows[0]
    participants = yield from select_rows(_PARTICIPANT_IDS, params)
    active = yield from select_rows(_ACTIVE_RUN, params)
    return ConversationRecord(
        id=id_, owner=owner, agent_id=agent_id, title=title, shared=bool(shared),
        audience_version=audience_version, last_seq=last_seq,
        participants=tuple(row[0] for row in participants),
        created_at=created_at, updated_at=updated_at,
        active_run={"id": active[0][0], "status": active[0][1]} if active else None)


# --- agents and members -------------------------------------------------------------------

_AGENT_COLUMNS = (_AGENTS.c.id, _AGENTS.c.name, _AGENTS.c.owner, _VERSIONS.c.version,
                  _VERSIONS.c.id, _VERSIONS.c.persona, _VERSIONS.c.tool_ceiling,
                  _VERSIONS.c.knowledge_scope, _VERSIONS.c.mode)
_CURRENT_VERSION = and_(_VERSIONS.c.agent_id == _AGENTS.c.id,
                        _VERSIONS.c.version == _AGENTS.c.current_version)
_AGENT = (select(*_AGENT_COLUMNS).select_from(_AGENTS.join(_VERSIONS, _CURRENT_VERSION))
          .where(_AGENTS.c.id == bindparam("b_agent_id"), _AGENTS.c.owner.is_(None)))
# A member sees the system agents and their own.
_AGENT_FOR = (select(*_AGENT_COLUMNS).select_from(_AGENTS.join(_VERSIONS, _CURRENT_VERSION))
              .where(_AGENTS.c.id == bindparam("b_agent_id"),
                     or_(_AGENTS.c.owner.is_(None), _AGENTS.c.owner == bindparam("b_member"))))


def agent_record(agent_id: str, member: str | None) -> Unit[AgentRecord | None]:
    """The agent at its current version, if visible to ``member`` (None: system agents
    only)."""
    rows = yield from select_rows(_AGENT if member is None else _AGENT_FOR,
                                  {"b_agent_id": agent_id, "b_member": member})
    if not rows:
        return None
    id_, name, owner, version, version_id, persona, ceiling, scope, mode = rows[0]
    return AgentRecord(id=id_, name=name, owner=owner, version=version, version_id=version_id,
                       persona=persona, tool_ceiling=tuple(ceiling),
                       knowledge_scope=dict(scope), mode=mode)


_MEMBER = select(_MEMBERS.c.id, _MEMBERS.c.display_name, _MEMBERS.c.approval_mode,
                 _MEMBERS.c.model, _MEMBERS.c.tool_result_compression).where(
    _MEMBERS.c.id == bindparam("b_member"))


def member_record(member_id: str) -> Unit[MemberRecord | None]:
    rows = yield from select_rows(_MEMBER, {"b_member": member_id})
    if not rows:
        return None
    id_, display_name, approval_mode, model, compression = rows[0]
    return MemberRecord(id_, display_name, approval_mode, model, bool(compression))


# --- runs ---------------------------------------------------------------------------------

_RUN_COLUMNS = (_RUNS.c.id, _RUNS.c.conversation_id, _RUNS.c.input_id, _RUNS.c.input_position,
                _RUNS.c.member, _RUNS.c.agent_version_id, _RUNS.c.audience_version,
                _RUNS.c.resource_digest, _RUNS.c.catalog_digest, _RUNS.c.model,
                _RUNS.c.status, _RUNS.c.reason, _RUNS.c.fence, _RUNS.c.steps,
                _RUNS.c.tool_calls, _RUNS.c.lease_owner)
_ADMISSION_FACTS = (select(*_RUN_COLUMNS, _INPUTS.c.text, _INPUTS.c.model, _FIRINGS.c.posture)
                    .select_from(_RUNS.join(_INPUTS, _INPUTS.c.id == _RUNS.c.input_id)
                                 .outerjoin(_FIRINGS, _FIRINGS.c.run_id == _RUNS.c.id))
                    .where(_RUNS.c.id == bindparam("b_run_id")))


def _run(row: tuple[Any, ...]) -> RunRecord:
    (id_, conversation_id, input_id, input_position, member, agent_version_id,
     audience_version, resource_digest, catalog_digest, model, status, reason, fence, steps,
     tool_calls, lease_owner) = row
    return RunRecord(id=id_, conversation_id=conversation_id, input_id=input_id,
                     input_position=input_position, member=member,
                     agent_version_id=agent_version_id, audience_version=audience_version,
                     resource_digest=resource_digest, catalog_digest=catalog_digest,
                     model=model, status=status, reason=reason, fence=fence, steps=steps,
                     tool_calls=tool_calls, lease_owner=lease_owner)


def admission_facts(run_id: str) -> Unit[tuple[RunRecord, str, str | None, str | None] | None]:
    """A run, its input's text, the model fixed at acceptance and, for a task's firing, its
    posture (None for a chat run); None when there is no such run."""
    rows = yield from select_rows(_ADMISSION_FACTS, {"b_run_id": run_id})
    if not rows:
        return None
    *run, text, model, posture = rows[0]
    return _run(tuple(run)), text, model, posture


# --- the journal --------------------------------------------------------------------------

_EVENT_COLUMNS = (_JOURNAL.c.conversation_id, _JOURNAL.c.seq, _JOURNAL.c.run_id, _JOURNAL.c.type,
                  _JOURNAL.c.actor, _JOURNAL.c.at, _JOURNAL.c.data)
_EXCHANGES = (select(*_EVENT_COLUMNS)
              .where(_JOURNAL.c.conversation_id == bindparam("b_conversation_id"),
                     or_(*(_JOURNAL.c.type == kind for kind in
                           ("input.accepted", "steering.accepted", "answer.committed"))))
              .order_by(_JOURNAL.c.seq))
_PAGE = (select(*_EVENT_COLUMNS)
         .where(_JOURNAL.c.conversation_id == bindparam("b_conversation_id"),
                _JOURNAL.c.seq > bindparam("b_after"))
         .order_by(_JOURNAL.c.seq).limit(bindparam("b_limit")))
# A participant's page: nothing at all for anyone else.
_PAGE_FOR = _PAGE.where(exists().where(
    _PARTICIPANTS.c.conversation_id == bindparam("b_conversation_id"),
    _PARTICIPANTS.c.member_id == bindparam("b_member")))


def exchanges(conversation_id: str) -> Unit[list[EventRecord]]:
    """Accepted inputs and committed answers, in order: what model context is built from."""
    rows = yield from select_rows(_EXCHANGES, {"b_conversation_id": conversation_id})
    return [EventRecord(c, seq, run_id, type_, actor, at, restore(data))
            for c, seq, run_id, type_, actor, at, data in rows]


def journal_page(conversation_id: str, member: str, after: int,
                 limit: int) -> Unit[list[EventRecord]]:
    """Up to ``limit`` events after ``after`` in ``seq`` order, for a participant (an empty
    page for anyone else: the caller checks membership first to tell them apart)."""
    rows = yield from select_rows(_PAGE_FOR, {"b_conversation_id": conversation_id,
                                              "b_member": member, "b_after": after,
                                              "b_limit": limit})
    return [EventRecord(c, seq, run_id, type_, actor, at, data)
            for c, seq, run_id, type_, actor, at, data in rows]
