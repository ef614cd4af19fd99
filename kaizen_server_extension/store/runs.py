"""Run rows: claim with a fence, lease, compare-and-set terminal, cancel, recovery.

Every state change is a conditional UPDATE whose WHERE clause states what must still be true;
the caller whose UPDATE touched the row acts, everyone else stands down (DESIGN.md).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Float, bindparam, exists, literal, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from kaizen_server_extension.protocol.errors import Conflict
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, utcnow
from kaizen_server_extension.store.records import EventRecord, RunRecord
from kaizen_server_extension.store.repositories import run_record
from kaizen_server_extension.store.run_journal import (
    _ACTIVE_STATUS,
    ACTIVE,
    Admission,
    admitted,
    live_conversation,
    settled,
)
from kaizen_server_extension.store.storable import restore
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, fetch

_RUNS = m.Base.metadata.tables[m.Run.__tablename__]


class _DatabaseClock(FunctionElement[datetime]):
    """The database server's current time plus an offset in seconds."""

    type = m.UTCDateTime()
    inherit_cache = True
    name = "kaizen_database_clock"


@compiles(_DatabaseClock, "postgresql")
def _postgresql_clock(element: _DatabaseClock, compiler: Any, **kw: Any) -> str:
    offset = compiler.process(element.clauses, **kw)
    return f"(clock_timestamp() + make_interval(secs => {offset}))"


@compiles(_DatabaseClock, "sqlite")
def _sqlite_clock(element: _DatabaseClock, compiler: Any, **kw: Any) -> str:
    # UTC with milliseconds, padded to the microsecond text SQLAlchemy stores, so stored and
    # computed times compare correctly as text.
    offset = compiler.process(element.clauses, **kw)
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {offset} || ' seconds') || '000')"


#: The advisory-lock namespace of holders' liveness (PostgreSQL), "KZ".
LIVENESS_LOCK_NAMESPACE = 0x4B5A
#: The suffix of a lease owner whose liveness the database holds.
LIVE_OWNER_SUFFIX = ":live"

# A run whose holder's liveness lock is gone: its process died (or lost the database), so
# PostgreSQL released the session lock the moment its connection ended. Only owners that said
# they hold one (``…:live``) are judged this way; any other holder keeps its lease.
HOLDER_GONE = text(
    # (text() reads ":name" as a parameter, so the suffix's colon is escaped.)
    "runs.lease_owner LIKE '%" + LIVE_OWNER_SUFFIX.replace(":", "\\:") + "' AND NOT EXISTS ("
    "SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
    f"AND l.classid = {LIVENESS_LOCK_NAMESPACE} AND l.objsubid = 2 "
    "AND l.objid::bigint = (hashtext(runs.lease_owner) & 2147483647) "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))")


def this_host() -> str:
    """Who "this host" is in a lease owner (``host:pid:nonce``): the host name, the PID
    namespace and the boot, so a pid is only ever judged where it means the same process
    (containers sharing a host name have PID namespaces of their own)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    except OSError:
        namespace = "?"
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}~{namespace}~{boot}"


def owner_gone_from_this_host(owner: str | None) -> bool:
    """Whether ``owner`` (``host:pid:nonce…``) was a process of this host — same host name,
    PID namespace and boot — that is no longer running: a restarted server takes its runs
    over at once instead of waiting out their lease (the embedded SQLite store has no other
    liveness to read). Any other owner is left to its lease or liveness lock."""
    if not owner:
        return False
    parts = owner.split(":")
    if len(parts) < 3 or parts[0] != this_host() or "?" in parts[0]:
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False


_EXTEND_LEASE = (update(_RUNS)
                 .where(_RUNS.c.id == bindparam("b_run_id"),
                        _RUNS.c.fence == bindparam("b_fence"), _ACTIVE_STATUS)
                 .values(lease_expires_at=_DatabaseClock(bindparam("b_lease_s", type_=Float())))
                 .returning(_RUNS.c.id))


def lease_extended(run_id: str, fence: int, lease: timedelta) -> Unit[bool]:
    rows = yield from fetch(_EXTEND_LEASE, {"b_run_id": run_id, "b_fence": fence,
                                            "b_lease_s": lease.total_seconds()})
    return bool(rows)


def database_clock(offset: timedelta = timedelta(0)) -> _DatabaseClock:
    """Now (plus ``offset``) on the database's clock. Leases are stamped and compared on this
    one clock, so replicas whose own clocks disagree still agree on which lease ran out."""
    return _DatabaseClock(literal(offset.total_seconds(), Float()))


_QUEUED = _RUNS.alias("queued_runs")
_CLAIMS = _RUNS.alias("active_runs")
_RUN_COLUMNS = (_RUNS.c.id, _RUNS.c.conversation_id, _RUNS.c.input_id, _RUNS.c.input_position,
                _RUNS.c.member, _RUNS.c.agent_version_id, _RUNS.c.audience_version,
                _RUNS.c.resource_digest, _RUNS.c.catalog_digest, _RUNS.c.model,
                _RUNS.c.status, _RUNS.c.reason, _RUNS.c.fence, _RUNS.c.steps,
                _RUNS.c.tool_calls, _RUNS.c.lease_owner)
# The room's oldest queued run becomes its active one, unless one is active already: then
# nothing matches (no error to raise and catch on every wake of a busy room). Two claims
# racing both pass the NOT EXISTS; the row lock makes the second see the first's status,
# and the partial unique index on active runs stays the database's last word.
_CLAIM = (
    update(_RUNS)
    .where(_RUNS.c.id == select(_QUEUED.c.id)
           .where(_QUEUED.c.conversation_id == bindparam("b_conversation_id"),
                  _QUEUED.c.status == "queued")
           .order_by(_QUEUED.c.input_position).limit(1).scalar_subquery(),
           _RUNS.c.status == "queued",
           ~exists().where(_CLAIMS.c.conversation_id == bindparam("b_conversation_id"),
                           or_(*(_CLAIMS.c.status == status for status in ACTIVE))))
    .values(status="running", fence=_RUNS.c.fence + 1, lease_owner=bindparam("b_owner"),
            lease_expires_at=_DatabaseClock(bindparam("b_lease_s", type_=Float())),
            started_at=bindparam("b_now"))
    .returning(*_RUN_COLUMNS)
)


def claimed(conversation_id: str, owner: str, lease: timedelta) -> Unit[RunRecord | None]:
    """Claim the room's oldest queued run as ``owner`` for ``lease``; None when the room is
    idle or has an active run."""
    rows = yield from fetch(_CLAIM, {"b_conversation_id": conversation_id, "b_owner": owner,
                                     "b_lease_s": lease.total_seconds(), "b_now": utcnow()})
    if not rows:
        return None
    return RunRecord(*rows[0])


class RunLane:
    """Database side of the room lane."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def queued_rooms(self) -> list[str]:
        async with self.store.transaction() as tx:
            rows = await tx.session.execute(
                select(m.Run.conversation_id).where(m.Run.status == "queued").distinct()
            )
            return [r[0] for r in rows]

    async def claim_next(self, conversation_id: str, owner: str,
                         lease: timedelta) -> RunRecord | None:
        """Claim the room's oldest queued run, or None when the room is busy or idle.

        The partial unique index on active runs makes a second claim fail in the database,
        even from another server process (R-024, R-027).
        """
        try:
            return await self.store.run(claimed(conversation_id, owner, lease))
        except IntegrityError:
            return None  # another run of this room became active meanwhile

    async def admit(self, run_id: str, fence: int, admission: Admission,
                    event_data: dict[str, Any]) -> bool:
        """Record the authority bundle and journal ``run.admitted``; False if fenced out.
        One unit, flushed before it returns (an admission is durable)."""
        notify = self.store.notifies
        return await self.store.run(admitted(run_id, fence, admission, event_data,
                                             notify=notify), single_statement=notify)

    async def check_live(self, tx: Tx, run_id: str, fence: int, *, steps: int = 0,
                         tool_calls: int = 0) -> str | None:
        """Inside ``tx``: the run's conversation id while it is still ours, else None."""
        return await tx.run(live_conversation(run_id, fence, steps=steps,
                                              tool_calls=tool_calls))

    async def extend_lease(self, run_id: str, fence: int, lease: timedelta) -> bool:
        """Push the run's lease ``lease`` past the database's now while it is still ours at
        ``fence``; False when it is not (one statement)."""
        return await self.store.run(lease_extended(run_id, fence, lease),
                                    single_statement=True)

    async def settle(self, run_id: str, status: str, reason: str, actor: str, *,
                     fence: int | None = None, data: dict[str, Any] | None = None,
                     tx: Tx | None = None) -> bool:
        """Compare-and-set the one terminal status and journal ``run.terminal`` with it."""
        notify = self.store.notifies
        unit = settled(run_id, status, reason, actor, fence=fence, data=data, notify=notify)
        if tx is None:
            # One statement on PostgreSQL, flushed before this returns: a terminal is durable.
            return await self.store.run(unit, single_statement=notify)
        return await tx.run(unit)

    async def cancel(self, run_id: str, member: str) -> RunRecord:
        """Cancel a run of a room the member participates in; 409 when already settled."""
        run = await self.store.runs.get_for(run_id, member)
        if run.status in m.TERMINAL_RUN_STATUSES:
            raise Conflict("The run has already finished.", code="run_already_settled")
        settled = await self.settle(run_id, "cancelled", "cancelled_by_member", member)
        if not settled:
            raise Conflict("The run has already finished.", code="run_already_settled")
        return await self.store.runs.get_for(run_id, member)

    async def stale_runs(self, now: datetime | None = None) -> list[RunRecord]:
        """Active runs whose lease ran out: their holder died or lost the database."""
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.Run).where(m.Run.status.in_(ACTIVE),
                                    m.Run.lease_expires_at < (now or database_clock()))
            )).scalars().all()
            return [run_record(r) for r in rows]

    async def orphaned_runs(self) -> list[RunRecord]:
        """Active runs, lease or not, whose holder is known to be gone: its liveness lock is
        no longer held (PostgreSQL), or it was a process of this host that is not running."""
        gone = HOLDER_GONE if self.store.engine.dialect.name == "postgresql" else None
        async with self.store.transaction() as tx:
            query = select(m.Run).where(m.Run.status.in_(ACTIVE),
                                        m.Run.lease_owner.is_not(None))
            rows = (await tx.session.execute(query)).scalars().all()
            dead = {r.id for r in rows if owner_gone_from_this_host(r.lease_owner)}
            if gone is not None:
                dead |= set((await tx.session.execute(
                    select(m.Run.id).where(m.Run.status.in_(ACTIVE), gone))).scalars().all())
            return [run_record(r) for r in rows if r.id in dead]

    # --- crash recovery that resumes (R-054) ---------------------------------------------

    async def take_over(self, run: RunRecord, owner: str, lease: timedelta, *,
                        holder_gone: bool = False) -> RunRecord | None:
        """Take a stale run over once: compare-and-set on its fence and expired lease (or,
        ``holder_gone``, on its fence and the dead holder that :meth:`orphaned_runs` found),
        bump the fence so its old holder's writes match nothing, and hold a fresh lease as
        ``owner`` while the recovery decides whether the run resumes or settles. None when
        another replica (or the live holder's renewal) got there first."""
        stale = (m.Run.lease_owner == run.lease_owner) if holder_gone and run.lease_owner \
            else (m.Run.lease_expires_at < database_clock())
        async with self.store.transaction() as tx:
            row = (await tx.session.execute(
                update(m.Run)
                .where(m.Run.id == run.id, m.Run.fence == run.fence,
                       m.Run.status.in_(ACTIVE), stale)
                .values(fence=m.Run.fence + 1, lease_owner=owner,
                        lease_expires_at=database_clock(lease))
                .returning(m.Run)
            )).scalar_one_or_none()
            return run_record(row) if row is not None else None

    async def run_events(self, run_id: str, conversation_id: str,
                         types: tuple[str, ...]) -> list[EventRecord]:
        """The run's journal events of the given types, in ``seq`` order (trusted callers)."""
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.JournalEvent)
                .where(m.JournalEvent.conversation_id == conversation_id,
                       m.JournalEvent.run_id == run_id, m.JournalEvent.type.in_(types))
                .order_by(m.JournalEvent.seq)
            )).scalars().all()
            return [EventRecord(r.conversation_id, r.seq, r.run_id, r.type, r.actor, r.at,
                                restore(r.data)) for r in rows]

    async def close_dangling(self, run_id: str, fence: int, results: list[dict[str, Any]],
                             actor: str, *, resumed: dict[str, Any] | None = None,
                             terminal: tuple[str, str, dict[str, Any]] | None = None) -> bool:
        """In one transaction, while the run is still ours at ``fence``: journal the rebuilt
        ``tool.settled`` of each dangling call (R-264), then either ``run.resumed`` with
        ``resumed`` or the one terminal ``(status, reason, data)`` (compare-and-set). False
        when the run was cancelled or taken over meanwhile: nothing is written."""
        async with self.store.transaction() as tx:
            conversation = await self.check_live(tx, run_id, fence)
            if conversation is None:
                return False
            for data in results:
                await tx.append_event(conversation, "tool.settled", actor, data, run_id=run_id)
            if terminal is not None:
                status, reason, extra = terminal
                return await self.settle(run_id, status, reason, actor, fence=fence,
                                         data=extra, tx=tx)
            await tx.append_event(conversation, "run.resumed", actor, resumed or {},
                                  run_id=run_id)
            return True
