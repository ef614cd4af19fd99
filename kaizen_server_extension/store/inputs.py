"""Accepting a member's input: the acceptance's statements, written once as a unit.

An acceptance bumps the room's two counters (its input ``position`` and its journal ``seq``),
inserts the accepted input, its queued run and the ``input.accepted`` journal event. The
counter bump locks the conversation row until the transaction ends, so every acceptance and
every journal write of the room's running turn queue behind one another there: how long the
row stays locked is the whole cost of a burst of messages into one room (bench/README.md,
``accept_latency.py``). So:

* on PostgreSQL the acceptance is **one statement** (data-modifying CTEs: bump, three
  inserts, the NOTIFY), run by the unit runner as its own implicit transaction
  (``Database.run(..., single_statement=True)``, store/units.py): the row is locked only while
  the database executes it, never across a round trip to this process, and the commit does
  not hold it across the WAL flush either: the runner waits for the flush after the lock is
  released, before the caller is answered;
* on SQLite the statements run one after the other in one BEGIN IMMEDIATE … COMMIT on the
  event loop's thread (nothing awaits in between).

Either way the database holds what must never break: the participant check is in the
UPDATE's WHERE clause (no row: NotFound), ``UNIQUE (conversation_id, position)``, ``UNIQUE
(conversation_id, seq)`` and ``UNIQUE (conversation_id, idempotency_key)``.

On PostgreSQL the acceptances a process holds at once are written together
(:func:`accept_batch`, gathered by store/accept_batch.py): one statement numbers them in
arrival order, per room, after the same checks, so a burst into one room pays one row-lock
hand-off and one WAL barrier per batch instead of per message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Text,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import _INSERT_EVENT, JOURNAL_CHANNEL
from kaizen_server_extension.store.models import UTCDateTime
from kaizen_server_extension.store.records import AcceptedInputRecord, EventRecord
from kaizen_server_extension.store.storable import StorableText, storable_document
from kaizen_server_extension.store.units import Appended, Unit, fetch

_TABLES = m.Base.metadata.tables
_CONVERSATIONS = _TABLES[m.Conversation.__tablename__]
_PARTICIPANTS = _TABLES[m.Participant.__tablename__]
_MEMBERS = _TABLES[m.Member.__tablename__]
_INPUTS = _TABLES[m.AcceptedInput.__tablename__]
_RUNS = _TABLES[m.Run.__tablename__]
_JOURNAL = _TABLES[m.JournalEvent.__tablename__]

# Both counters in one UPDATE, only for a participant (anyone else: no row, NotFound).
_BUMP = (
    update(_CONVERSATIONS)
    .where(_CONVERSATIONS.c.id == bindparam("b_conversation_id"),
           exists().where(_PARTICIPANTS.c.conversation_id == _CONVERSATIONS.c.id,
                          _PARTICIPANTS.c.member_id == bindparam("b_member")))
    .values(last_position=_CONVERSATIONS.c.last_position + 1,
            last_seq=_CONVERSATIONS.c.last_seq + 1, updated_at=bindparam("b_now"))
    .returning(_CONVERSATIONS.c.last_position, _CONVERSATIONS.c.last_seq,
               _CONVERSATIONS.c.audience_version)
)
# A steering message carries the steering member's server-resolved model; ``b_model_of`` is
# that member for a steering message and NULL (no row, so no model) for any other.
_MODEL = (select(_MEMBERS.c.model).where(_MEMBERS.c.id == bindparam("b_model_of"))
          .scalar_subquery())
_INPUT_COLUMNS = ("id", "conversation_id", "position", "kind", "member", "text", "text_digest",
                  "idempotency_key", "model", "created_at")
_RUN_COLUMNS = ("id", "conversation_id", "input_id", "input_position", "member", "status",
                "fence", "steps", "tool_calls", "created_at")
_EVENT_COLUMNS = ("conversation_id", "seq", "run_id", "type", "actor", "at", "data")


def _param(name: str, column: Any) -> Any:
    return bindparam(name, type_=column.type)


def _input_values(position: Any) -> list[Any]:
    c = _INPUTS.c
    return [_param("b_input_id", c.id), _param("b_conversation_id", c.conversation_id),
            position, _param("b_kind", c.kind), _param("b_member", c.member),
            _param("b_text", c.text), _param("b_digest", c.text_digest),
            _param("b_key", c.idempotency_key), _MODEL, _param("b_now", c.created_at)]


def _run_values(position: Any) -> list[Any]:
    c = _RUNS.c
    return [_param("b_run_id", c.id), _param("b_conversation_id", c.conversation_id),
            _param("b_input_id", c.input_id), position, _param("b_member", c.member),
            literal("queued", c.status.type), literal(0), literal(0), literal(0),
            _param("b_now", c.created_at)]


# SQLite: the statements one by one (it has no data-modifying CTEs).
_INSERT_INPUT = insert(_INPUTS).from_select(
    list(_INPUT_COLUMNS), select(*_input_values(_param("b_position", _INPUTS.c.position))))
_INSERT_RUN = insert(_RUNS).from_select(
    list(_RUN_COLUMNS), select(*_run_values(_param("b_position", _RUNS.c.input_position))))

# PostgreSQL: one statement. The sub-statements all see the bumped row; the foreign keys
# between them are checked at the statement's end, when every row is there.
_BUMPED = _BUMP.cte("bumped")
_ACCEPTED = (insert(_INPUTS).from_select(list(_INPUT_COLUMNS),
                                         select(*_input_values(_BUMPED.c.last_position)))
             .returning(_INPUTS.c.id).cte("accepted"))
_QUEUED = (insert(_RUNS).from_select(list(_RUN_COLUMNS),
                                     select(*_run_values(_BUMPED.c.last_position)))
           .returning(_RUNS.c.id).cte("queued"))
# The event's data gets the position and audience version the bump returned.
_DATA = bindparam("b_data", type_=_JOURNAL.c.data.type).op("||", return_type=JSONB)(
    func.jsonb_build_object(literal("position", Text), _BUMPED.c.last_position,
                            literal("audience_version", Text),
                            _BUMPED.c.audience_version))
_JOURNALED = (insert(_JOURNAL).from_select(list(_EVENT_COLUMNS), select(
    _param("b_conversation_id", _JOURNAL.c.conversation_id), _BUMPED.c.last_seq,
    _param("b_run_id", _JOURNAL.c.run_id), _param("b_type", _JOURNAL.c.type),
    _param("b_member", _JOURNAL.c.actor), _param("b_now", _JOURNAL.c.at), _DATA))
    .returning(_JOURNAL.c.conversation_id, _JOURNAL.c.seq).cte("journaled"))
_ACCEPT_NOTIFYING = (
    select(_BUMPED.c.last_position, _BUMPED.c.last_seq, _BUMPED.c.audience_version,
           func.pg_notify(literal(JOURNAL_CHANNEL, Text), cast(func.json_build_object(
               literal("n", Text), func.current_schema(),
               literal("c", Text), _JOURNALED.c.conversation_id,
               literal("s", Text), _JOURNALED.c.seq), Text)))
    .select_from(_BUMPED.join(_JOURNALED, true()))
    .add_cte(_ACCEPTED, _QUEUED)
)


@dataclass(frozen=True, slots=True)
class NewInput:
    """What a member sent, as the acceptance writes it."""

    conversation_id: str
    member: str
    text: str
    text_digest: str
    kind: str
    idempotency_key: str | None
    input_id: str
    run_id: str
    #: The pinned attachments' identities, as the journal shows them (store/attachments.py).
    attachments: tuple[dict[str, Any], ...] = ()


def accept_input(new: NewInput, *, now: Any, notify: bool) -> Unit[AcceptedInputRecord | None]:
    """Accept ``new`` with the room's next position and journal ``seq``; None (nothing
    written) when there is no such conversation or ``new.member`` does not take part in it.
    ``notify`` (PostgreSQL) makes it the one statement described above."""
    event_type = "steering.accepted" if new.kind == "steering" else "input.accepted"
    params = {"b_conversation_id": new.conversation_id, "b_member": new.member,
              "b_now": now, "b_input_id": new.input_id, "b_run_id": new.run_id,
              "b_kind": new.kind, "b_text": new.text, "b_digest": new.text_digest,
              "b_key": new.idempotency_key, "b_type": event_type,
              "b_model_of": new.member if new.kind == "steering" else None}
    extra = {"attachments": list(new.attachments)} if new.attachments else {}
    if notify:
        # The event's data as stored: these fields, then the bump's two (``||``).
        base = storable_document({"input_id": new.input_id, "text": new.text,
                                  "kind": new.kind, **extra})
        rows = yield from fetch(_ACCEPT_NOTIFYING, {**params, "b_data": base})
        if not rows:
            return None
        position, seq, audience_version = rows[0][0], rows[0][1], rows[0][2]
        data = {**base, "position": position, "audience_version": audience_version}
        yield Appended(EventRecord(new.conversation_id, seq, new.run_id, event_type,
                                   new.member, now, data))
    else:
        rows = yield from fetch(_BUMP, params)
        if not rows:
            return None
        position, seq, audience_version = rows[0][0], rows[0][1], rows[0][2]
        yield from fetch(_INSERT_INPUT, {**params, "b_position": position})
        yield from fetch(_INSERT_RUN, {**params, "b_position": position})
        yield from _journal_at(seq, new, event_type, now, {
            "input_id": new.input_id, "position": position, "text": new.text,
            "kind": new.kind, "audience_version": audience_version, **extra})
    return AcceptedInputRecord(new.input_id, new.conversation_id, int(position), new.kind,
                               new.member, new.run_id, new.text_digest,
                               new.idempotency_key, created=True)


def _journal_at(seq: int, new: NewInput, event_type: str, now: Any,
                data: dict[str, Any]) -> Unit[EventRecord]:
    """The acceptance's journal event at the ``seq`` its bump already took (SQLite)."""
    data = storable_document(data)
    yield from fetch(_INSERT_EVENT, {
        "b_conversation_id": new.conversation_id, "b_seq": seq, "b_run_id": new.run_id,
        "b_type": event_type, "b_actor": new.member, "b_at": now, "b_data": data})
    record = EventRecord(new.conversation_id, seq, new.run_id, event_type, new.member, now,
                         data)
    yield Appended(record)
    return record



# PostgreSQL, a batch: the same acceptance for many inputs in one statement, each input a
# row of the arrays (in arrival order: ``ord``). An input is written when its member takes
# part in its room and, with an idempotency key, no input of the room holds that key yet;
# the others get no row back (the caller tells NotFound from a replay, store/
# repositories.py). The rooms' rows are locked in id order (``locked``), so two batches
# sharing rooms never deadlock; each room's counters then move by its count of inputs,
# which take the positions and seqs in between in arrival order. One NOTIFY per room, with
# its last seq: a notice says "the journal holds events up to seq" (events/bus.py).
_BATCH_ARRAYS = ("conversation_ids", "members", "input_ids", "run_ids", "kinds", "texts",
                 "digests", "keys", "models_of", "datas", "ats")
_ACCEPT_BATCH = text(f"""
WITH batch AS (
    SELECT * FROM unnest(:conversation_ids, :members, :input_ids, :run_ids, :kinds, :texts,
                         :digests, :keys, :models_of, :datas, :ats)
        WITH ORDINALITY AS b(conversation_id, member, input_id, run_id, kind, text, digest,
                             key, model_of, data, at, ord)
), admitted AS (
    SELECT b.*, row_number() OVER (PARTITION BY b.conversation_id ORDER BY b.ord) AS k
    FROM batch AS b
    WHERE EXISTS (SELECT FROM participants AS p
                  WHERE p.conversation_id = b.conversation_id AND p.member_id = b.member)
      AND (b.key IS NULL OR NOT EXISTS (
               SELECT FROM accepted_inputs AS a
               WHERE a.conversation_id = b.conversation_id AND a.idempotency_key = b.key))
), counted AS (
    SELECT conversation_id, count(*) AS n, max(at) AS at FROM admitted GROUP BY conversation_id
), locked AS (
    SELECT c.id FROM conversations AS c
    WHERE c.id IN (SELECT conversation_id FROM counted)
    ORDER BY c.id FOR UPDATE
), bumped AS (
    UPDATE conversations AS c
    SET last_position = c.last_position + counted.n, last_seq = c.last_seq + counted.n,
        updated_at = counted.at
    FROM counted JOIN locked ON locked.id = counted.conversation_id
    WHERE c.id = counted.conversation_id
    RETURNING c.id, c.last_position - counted.n AS position0, c.last_seq - counted.n AS seq0,
              c.audience_version
), numbered AS (
    SELECT a.*, bumped.position0 + a.k AS position, bumped.seq0 + a.k AS seq,
           bumped.audience_version
    FROM admitted AS a JOIN bumped ON bumped.id = a.conversation_id
), accepted AS (
    INSERT INTO accepted_inputs (id, conversation_id, position, kind, member, text,
                                 text_digest, idempotency_key, model, created_at)
    SELECT input_id, conversation_id, position, kind, member, text, digest, key,
           (SELECT model FROM members WHERE members.id = numbered.model_of), at
    FROM numbered
), queued AS (
    INSERT INTO runs (id, conversation_id, input_id, input_position, member, status, fence,
                      steps, tool_calls, created_at)
    SELECT run_id, conversation_id, input_id, position, member, 'queued', 0, 0, 0, at
    FROM numbered
), journaled AS (
    INSERT INTO journal (conversation_id, seq, run_id, type, actor, at, data)
    SELECT conversation_id, seq, run_id,
           CASE kind WHEN 'steering' THEN 'steering.accepted' ELSE 'input.accepted' END,
           member, at,
           CAST(data AS jsonb) || jsonb_build_object('position', position,
                                                     'audience_version', audience_version)
    FROM numbered
    RETURNING conversation_id, seq
), notified AS (
    SELECT pg_notify('{JOURNAL_CHANNEL}', CAST(json_build_object(
        'n', current_schema(), 'c', conversation_id, 's', max(seq)) AS text))
    FROM journaled GROUP BY conversation_id
)
SELECT batch.ord, numbered.position, numbered.seq, numbered.audience_version
FROM batch LEFT JOIN numbered ON numbered.ord = batch.ord
WHERE (SELECT count(*) FROM notified) >= 0
""").bindparams(*(
    bindparam(name, type_=ARRAY(UTCDateTime() if name == "ats" else StorableText()))
    for name in _BATCH_ARRAYS))


@dataclass(frozen=True, slots=True)
class Arrival:
    """One input of a batch: what was sent, and when it arrived."""

    new: NewInput
    at: datetime


def accept_batch(arrivals: Sequence[Arrival]) -> Unit[list[AcceptedBatchItem | None]]:
    """Accept each of ``arrivals`` (PostgreSQL, one statement; see ``_ACCEPT_BATCH``): per
    arrival, in order, what was written, or None when nothing was (not a participant, no
    such room, or its idempotency key is already taken in the room).

    The unit appends no :class:`Appended`: the batcher publishes the events itself, once the
    batch is on disk (store/accept_batch.py)."""
    bases = [storable_document({"input_id": a.new.input_id, "text": a.new.text,
                                "kind": a.new.kind}) for a in arrivals]
    rows = yield from fetch(_ACCEPT_BATCH, {
        "conversation_ids": [a.new.conversation_id for a in arrivals],
        "members": [a.new.member for a in arrivals],
        "input_ids": [a.new.input_id for a in arrivals],
        "run_ids": [a.new.run_id for a in arrivals],
        "kinds": [a.new.kind for a in arrivals],
        "texts": [a.new.text for a in arrivals],
        "digests": [a.new.text_digest for a in arrivals],
        "keys": [a.new.idempotency_key for a in arrivals],
        "models_of": [a.new.member if a.new.kind == "steering" else None for a in arrivals],
        "datas": [json.dumps(base) for base in bases],
        "ats": [a.at for a in arrivals],
    })
    written: list[AcceptedBatchItem | None] = [None] * len(arrivals)
    for ordinal, position, seq, audience_version in rows:
        if position is None:
            continue
        i = ordinal - 1
        new = arrivals[i].new
        event_type = "steering.accepted" if new.kind == "steering" else "input.accepted"
        data = {**bases[i], "position": position, "audience_version": audience_version}
        written[i] = AcceptedBatchItem(
            AcceptedInputRecord(new.input_id, new.conversation_id, int(position), new.kind,
                                new.member, new.run_id, new.text_digest,
                                new.idempotency_key, created=True),
            EventRecord(new.conversation_id, seq, new.run_id, event_type, new.member,
                        arrivals[i].at, data))
    return written


@dataclass(frozen=True, slots=True)
class AcceptedBatchItem:
    """An input a batch wrote: its acceptance and its journal event."""

    accepted: AcceptedInputRecord
    event: EventRecord
