"""The store's transaction core: one async engine, transactions that publish what they append.

:class:`Database` opens session transactions (:meth:`Database.transaction`) and runs units
straight on the driver (:meth:`Database.run`, store/units.py). Journal events appended inside
a transaction are published to observers only after that transaction commits, so an observer
never sees an event the database does not have. The journal append and the audit insert, the
two statements every turn writes most, are built once here. Repositories over it are in
store/repositories.py; :class:`~kaizen_server_extension.store.store.Store` is the database
with its repositories.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import bindparam, insert, literal_column, select, update
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.records import (
    EventRecord,
)
from kaizen_server_extension.store.storable import UnstorableText, storable_document
from kaizen_server_extension.store.units import (
    Appended,
    DirectRunner,
    Unit,
    UnitCounts,
    fetch,
    run_in_session,
)

T = TypeVar("T")
EventListener = Callable[[Sequence[EventRecord]], None]

# Other server processes on the same PostgreSQL database learn of appends on this channel
# (events/wire.py decodes it). Sent inside the appending transaction, so PostgreSQL delivers
# it exactly when the append commits, and never for a rolled-back one.
JOURNAL_CHANNEL = "kaizen_journal"

# The hot journal and audit statements are built once: a reused statement object skips
# SQLAlchemy's per-call construction and goes straight to its compiled cache. They are Core
# statements on the tables, so no ORM bulk-update evaluation or unit-of-work flush runs.
_CONVERSATIONS = m.Base.metadata.tables[m.Conversation.__tablename__]
_JOURNAL = m.Base.metadata.tables[m.JournalEvent.__tablename__]
_BUMP_SEQ = (
    update(_CONVERSATIONS)
    .where(_CONVERSATIONS.c.id == bindparam("b_conversation_id"))
    .values(last_seq=_CONVERSATIONS.c.last_seq + 1, updated_at=bindparam("b_now"))
    .returning(_CONVERSATIONS.c.last_seq)
)
_INSERT_EVENT = insert(_JOURNAL).values(
    conversation_id=bindparam("b_conversation_id"), seq=bindparam("b_seq"),
    run_id=bindparam("b_run_id"), type=bindparam("b_type"), actor=bindparam("b_actor"),
    at=bindparam("b_at"), data=bindparam("b_data"))
_BUMPED = _BUMP_SEQ.cte("bumped")
_APPEND_NOTIFYING = (
    insert(_JOURNAL)
    .from_select(
        ["conversation_id", "seq", "run_id", "type", "actor", "at", "data"],
        select(bindparam("b_conversation_id", type_=_JOURNAL.c.conversation_id.type),
               _BUMPED.c.last_seq,
               bindparam("b_run_id", type_=_JOURNAL.c.run_id.type),
               bindparam("b_type", type_=_JOURNAL.c.type.type),
               bindparam("b_actor", type_=_JOURNAL.c.actor.type),
               bindparam("b_at", type_=_JOURNAL.c.at.type),
               bindparam("b_data", type_=_JOURNAL.c.data.type)),
    )
    .add_cte(_BUMPED)
    .returning(_JOURNAL.c.seq, literal_column(
        f"pg_notify('{JOURNAL_CHANNEL}', json_build_object("
        "'n', current_schema(), 'c', conversation_id, 's', seq)::text)"))
)
_AUDIT = m.Base.metadata.tables[m.AuditEvent.__tablename__]
_INSERT_AUDIT = insert(_AUDIT).values(
    at=bindparam("b_at"), actor=bindparam("b_actor"), action=bindparam("b_action"),
    data=bindparam("b_data"), conversation_id=bindparam("b_conversation_id"),
    run_id=bindparam("b_run_id"))


def journal_append(conversation_id: str, type: str, actor: str, data: dict[str, Any], *,
                   run_id: str | None, notify: bool) -> Unit[EventRecord]:
    """Append one journal event with the conversation's next ``seq``.

    The counter bump and the insert share the unit's transaction; the database's UNIQUE
    (conversation_id, seq) is the second line should two writers ever race. ``notify``
    (PostgreSQL) makes it one statement that also tells other processes (JOURNAL_CHANNEL).
    A ``data`` holding text the databases cannot store is journaled escaped and flagged
    (store/storable.py), and the record observers get is exactly what was stored.
    """
    data = storable_document(data)
    now = utcnow()
    params = {"b_conversation_id": conversation_id, "b_now": now, "b_run_id": run_id,
              "b_type": type, "b_actor": actor, "b_at": now, "b_data": data}
    if notify:
        seq = (yield from fetch(_APPEND_NOTIFYING, params))[0][0]
    else:
        seq = (yield from fetch(_BUMP_SEQ, params))[0][0]
        yield from fetch(_INSERT_EVENT, {**params, "b_seq": seq})
    record = EventRecord(conversation_id, seq, run_id, type, actor, now, data)
    yield Appended(record)
    return record


def audit_insert(actor: str, action: str, data: dict[str, Any], *,
                 conversation_id: str | None = None,
                 run_id: str | None = None) -> Unit[None]:
    """One append-only audit row (its ``data`` column type escapes it as the journal's,
    store/storable.py)."""
    yield from fetch(_INSERT_AUDIT, {
        "b_at": utcnow(), "b_actor": actor, "b_action": action, "b_data": data,
        "b_conversation_id": conversation_id, "b_run_id": run_id})


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def text_digest(text: str) -> str:
    try:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:  # an unpaired surrogate: no column may hold it either
        raise UnstorableText() from None


@dataclass
class Tx:
    """One open transaction and the journal events it appended so far."""

    session: AsyncSession
    appended: list[EventRecord] = field(default_factory=list)

    @property
    def notifies(self) -> bool:
        """Whether journal appends notify other processes (PostgreSQL)."""
        return self.session.get_bind().dialect.name == "postgresql"

    async def run(self, unit: Unit[T]) -> T:
        """Run ``unit`` as part of this transaction."""
        result, appended = await run_in_session(self.session, unit)
        self.appended.extend(appended)
        return result

    async def append_event(
        self,
        conversation_id: str,
        type: str,
        actor: str,
        data: dict[str, Any],
        *,
        run_id: str | None = None,
    ) -> EventRecord:
        return await self.run(journal_append(conversation_id, type, actor, data,
                                             run_id=run_id, notify=self.notifies))

    async def audit(
        self,
        actor: str,
        action: str,
        data: dict[str, Any],
        *,
        conversation_id: str | None = None,
        run_id: str | None = None,
    ) -> None:
        await self.run(audit_insert(actor, action, data, conversation_id=conversation_id,
                                    run_id=run_id))


class Database:
    """The engine, its sessions and units, and the observers of what commits."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._listeners: list[EventListener] = []
        self._units = DirectRunner.for_engine(engine)

    def add_listener(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    @property
    def notifies(self) -> bool:
        """Whether journal appends notify other processes (PostgreSQL)."""
        return self.engine.dialect.name == "postgresql"

    @property
    def unit_counts(self) -> UnitCounts:
        """What ``run`` ran so far (session transactions are not included)."""
        return self._units.counts

    async def run(self, unit: Unit[T], *, write: bool = True, durable: bool = True,
                  single_statement: bool = False) -> T:
        """Run ``unit`` as one transaction of its own, straight on the driver
        (store/units.py); observers see its appends once it commits.

        A unit that started runs to its end even when the caller is cancelled meanwhile, so a
        committed append is always published and the caller never guesses whether it
        committed. ``durable=False`` lets it commit without waiting for the log flush
        (PostgreSQL; see units.py); ``write=False`` runs it read-only. ``single_statement``:
        the unit (a write) is one statement, which on PostgreSQL runs as its own implicit
        transaction and holds its row locks only while it executes (units.py).
        """
        done = asyncio.ensure_future(self._units.run(unit, write=write, durable=durable,
                                                     single_statement=single_statement))
        done.add_done_callback(self._publish_unit)
        result, _appended = await asyncio.shield(done)
        return result

    async def run_flushed_statement(self, unit: Unit[T]) -> T:
        """Run the one-statement write ``unit`` as its own transaction and return once it
        is on disk, in one round trip (PostgreSQL: on a connection of its own whose commit
        waits for the WAL flush, holding the statement's row locks through it; units.py).
        For a few large writes whose answer must mean "on disk" (the acceptance batches).
        Like :meth:`run`, a statement that started runs to its end if the caller is
        cancelled."""
        done = asyncio.ensure_future(self._units.run_flushed_statement(unit))
        done.add_done_callback(self._publish_unit)
        result, _appended = await asyncio.shield(done)
        return result

    async def read(self, make: Callable[..., Unit[T]], *args: Any,
                   single_statement: bool = False) -> T:
        """Run the read-only unit ``make(*args)`` straight on the driver (store/units.py):
        no session, no writer gate, nothing to publish. ``make`` may be called again for a
        fresh unit (a busy SQLite, a PostgreSQL connection found dead). ``single_statement``:
        the unit is one statement, which PostgreSQL runs as its own implicit transaction.

        Each read sees the last commit; reads that must agree with one another belong in
        one unit (one snapshot)."""
        return await self._units.read(make, args, single_statement=single_statement)

    async def flushed(self) -> None:
        """Return once every unit that committed before this call is on disk (units
        committed with ``durable=False`` included; store/units.py)."""
        await self._units.flushed()

    def publish(self, appended: Sequence[EventRecord]) -> None:
        """Publish journal events a caller committed itself (store/accept_batch.py) to the
        observers; only once they are durable."""
        self._publish(appended)

    def _publish_unit(self, done: asyncio.Future[tuple[Any, list[EventRecord]]]) -> None:
        if done.cancelled() or done.exception() is not None:
            return  # the exception reaches the caller, unless it was cancelled meanwhile
        self._publish(done.result()[1])

    def _publish(self, appended: Sequence[EventRecord]) -> None:
        if appended:
            for listener in self._listeners:
                listener(tuple(appended))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        try:
            async with self.writer_gate(), self._sessions() as session, session.begin():
                tx = Tx(session)
                yield tx
        except StatementError as exc:
            # A column type refused a value at bind time (store/storable.py): the statement
            # never ran and the transaction rolled back; the caller gets the member error.
            if isinstance(exc.orig, UnstorableText):
                raise exc.orig from None
            raise
        # Committed: now observers may see what was appended.
        self._publish(tx.appended)

    def writer_gate(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold around any transaction opened on the engine directly (``transaction`` holds
        it): on SQLite, this process's writers then queue here rather than at the database's
        lock (store/units.py)."""
        return self._units.writer_gate()

    async def dispose(self) -> None:
        await self._units.dispose()
        await self.engine.dispose()
