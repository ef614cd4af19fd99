"""Durable tasks: a member's saved prompt fired into one of their rooms (R-051..R-059).

A firing never runs anything itself. It becomes an ordinary accepted input of the owner in
the task's room, so the run goes through the same queue, room lane, admission, pipeline and
journal as a chat message (R-051); the lane learns the run's posture from its firing row
(``posture_of``) when it admits it (R-053).

Exactly once, across replicas and crashes:

* a scheduled firing moves ``tasks.next_due_at`` forward with a compare-and-set *and* inserts
  its ``task_firings`` row, whose key ``due:<time>`` is unique per task — a second replica
  that saw the same due time loses in the database;
* the firing is committed before its input is accepted, and the input's idempotency key is
  the firing's id, so whoever finds a firing without a run (``unfinished_firings``) finishes
  it and can only ever produce the one input (R-054).

Missed firings: after downtime a task fires once, at the first look, for every due time that
passed (they are coalesced and counted in ``missed_firings``); the next due time is the first
slot of its cadence after now. A task never fires a backlog.

Authority: a task's run acts for its owner only while the task still says so. Before every
action that may have an effect, ``current_authority`` re-reads the task: deleted, edited
since the firing (any edit bumps ``version``) or the owner no longer in the room, and the
action is refused; it never falls back to what was true at firing time (R-056, R-057).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, select, update
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import Conflict, NotFound, SchemaViolation
from kaizen_server_extension.protocol.tasks import (
    MAX_TASK_INTERVAL_S,
    MAX_TASK_NAME_CHARS,
    MAX_TASK_PROMPT_CHARS,
    MIN_TASK_INTERVAL_S,
)
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.records import CHAT_POSTURE, AcceptedInputRecord
from kaizen_server_extension.store.store import Store

log = logging.getLogger("kaizen.tasks")

TASK_AUDIT_ACTIONS = {"created": "task.created", "updated": "task.updated",
                      "deleted": "task.deleted", "fired": "task.fired"}
MAX_NAME_CHARS = MAX_TASK_NAME_CHARS
MAX_PROMPT_CHARS = MAX_TASK_PROMPT_CHARS
MAX_INTERVAL_S = MAX_TASK_INTERVAL_S
#: A firing left without a run for this long is finished by whoever sees it (its writer
#: crashed between the two commits).
UNFINISHED_AFTER = timedelta(seconds=5)
_KEY = re.compile(r"[A-Za-z0-9._:-]{1,160}")
#: (owner, conversation id, prompt) -> None, or raises a MemberError naming what is wrong
PromptCheck = Callable[[str, str, str], Awaitable[None]]


class TaskNotFound(NotFound):
    default_code = "task_not_found"


@dataclass(frozen=True, slots=True)
class TaskRecord:
    id: str
    owner: str
    conversation_id: str
    name: str
    prompt: str
    interval_seconds: int | None
    next_due_at: datetime | None
    status: str
    version: int
    missed_firings: int
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id, "conversation_id": self.conversation_id, "name": self.name,
            "prompt": self.prompt, "interval_seconds": self.interval_seconds,
            "next_due_at": self.next_due_at.isoformat() if self.next_due_at else None,
            "status": self.status, "version": self.version,
            "missed_firings": self.missed_firings,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class FiringRecord:
    id: str
    task_id: str | None  # None once its task was deleted
    key: str
    kind: str
    posture: str
    due_at: datetime
    run_id: str | None
    error: str | None
    task_version: int
    created_at: datetime
    conversation_id: str | None = None
    #: The run's status when read with it (None: not accepted, or not read).
    run_status: str | None = None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id, "task_id": self.task_id, "kind": self.kind,
            "posture": self.posture, "due_at": self.due_at.isoformat(),
            "run_id": self.run_id, "run_status": self.run_status, "error": self.error,
            "conversation_id": self.conversation_id,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class TaskAuthority:
    """What a task's run may act as, read now: the task, its owner and the firing's posture."""

    task_id: str
    owner: str
    posture: str
    fired_version: int


def _task(row: m.Task) -> TaskRecord:
    return TaskRecord(row.id, row.owner, row.conversation_id, row.name, row.prompt,
                      row.interval_seconds, row.next_due_at, row.status, row.version,
                      row.missed_firings, row.created_at, row.updated_at)


def _firing(row: m.TaskFiring, *, conversation_id: str | None = None,
            run_status: str | None = None) -> FiringRecord:
    return FiringRecord(row.id, row.task_id, row.key, row.kind, row.posture, row.due_at,
                        row.run_id, row.error, row.task_version, row.created_at,
                        conversation_id, run_status)


def check_text(field: str, value: str, limit: int) -> str:
    """A name or prompt: not blank, within ``limit`` characters."""
    if not value.strip():
        raise SchemaViolation(f"The task's {field} cannot be empty.", code="schema_violation")
    if len(value) > limit:
        raise SchemaViolation(f"The task's {field} is longer than {limit} characters.",
                              code="schema_violation")
    return value


def check_interval(interval_seconds: int | None) -> int | None:
    if interval_seconds is None:
        return None
    if not MIN_TASK_INTERVAL_S <= interval_seconds <= MAX_INTERVAL_S:
        raise SchemaViolation(
            f"A task's interval is between {MIN_TASK_INTERVAL_S} seconds and a year "
            f"({MAX_INTERVAL_S} seconds).", code="task_interval_invalid")
    return interval_seconds


def next_slot(due: datetime, interval_s: int, now: datetime) -> tuple[datetime, int]:
    """The first slot of the cadence through ``due`` strictly after ``now``, and how many
    slots after ``due`` were skipped on the way (the coalesced missed firings)."""
    step = timedelta(seconds=interval_s)
    if due > now:
        return due, 0
    behind = int((now - due) / step)  # whole intervals since due, all passed
    return due + step * (behind + 1), behind


class TaskStore:
    def __init__(self, store: Store, *, check_prompt: PromptCheck | None = None) -> None:
        self.store = store
        # The prompt's step attachments, checked against the tools of now before a prompt is
        # saved (host/tool_backend.py, R-207); the run checks them again.
        self._check_prompt = check_prompt

    # --- the owner's tasks ------------------------------------------------------------------

    async def create(self, owner: str, *, conversation_id: str, name: str, prompt: str,
                     interval_seconds: int | None = None,
                     first_run_at: datetime | None = None) -> TaskRecord:
        """A task of ``owner`` in a room they take part in (else NotFound, nothing written).
        With a cadence it is first due at ``first_run_at`` (default: one interval from now)."""
        check_text("name", name, MAX_NAME_CHARS)
        check_text("prompt", prompt, MAX_PROMPT_CHARS)
        check_interval(interval_seconds)
        if first_run_at is not None and interval_seconds is None:
            raise SchemaViolation("first_run_at needs an interval_seconds cadence.",
                                  code="schema_violation")
        if self._check_prompt is not None:
            await self._check_prompt(owner, conversation_id, prompt)
        now = utcnow()
        due = None
        if interval_seconds is not None:
            due = first_run_at or now + timedelta(seconds=interval_seconds)
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, owner, tx)
            row = m.Task(id=new_id(), owner=owner, conversation_id=conversation_id, name=name,
                         prompt=prompt, interval_seconds=interval_seconds, next_due_at=due,
                         status="active", version=1, missed_firings=0, created_at=now,
                         updated_at=now)
            tx.session.add(row)
            await tx.session.flush()
            await tx.audit(owner, TASK_AUDIT_ACTIONS["created"],
                           {"task_id": row.id, "interval_seconds": interval_seconds},
                           conversation_id=conversation_id)
            return _task(row)

    async def list_for(self, owner: str) -> list[TaskRecord]:
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.Task).where(m.Task.owner == owner)
                .order_by(m.Task.created_at, m.Task.id))).scalars().all()
            return [_task(r) for r in rows]

    async def get_for(self, owner: str, task_id: str, tx: Tx | None = None) -> TaskRecord:
        """The task if ``owner`` owns it; another member's task is indistinguishable from a
        missing one (R-059)."""
        if tx is None:
            async with self.store.transaction() as own:
                return await self.get_for(owner, task_id, own)
        row = await self._owned_row(tx, owner, task_id)
        return _task(row)

    async def _owned_row(self, tx: Tx, owner: str, task_id: str) -> m.Task:
        row = (await tx.session.execute(
            select(m.Task).where(m.Task.id == task_id, m.Task.owner == owner)
        )).scalar_one_or_none()
        if row is None:
            raise TaskNotFound("No such task.")
        return row

    async def update(self, owner: str, task_id: str, *, expected_version: int | None = None,
                     name: str | None = None, prompt: str | None = None,
                     interval_seconds: int | None = None, clear_interval: bool = False,
                     status: str | None = None) -> TaskRecord:
        """Edit, pause or resume. Any edit bumps the version, which withdraws the authority of
        the task's runs still in flight (R-186's rule for goals, applied to tasks)."""
        if name is not None:
            check_text("name", name, MAX_NAME_CHARS)
        if prompt is not None:
            check_text("prompt", prompt, MAX_PROMPT_CHARS)
        check_interval(interval_seconds)
        if status is not None and status not in m.TASK_STATUSES:
            raise SchemaViolation("status is active or paused.", code="schema_violation")
        if prompt is not None and self._check_prompt is not None:
            current = await self.get_for(owner, task_id)
            await self._check_prompt(owner, current.conversation_id, prompt)
        now = utcnow()
        async with self.store.transaction() as tx:
            row = await self._owned_row(tx, owner, task_id)
            if expected_version is not None and row.version != expected_version:
                raise Conflict(f"The task changed meanwhile (it is at version {row.version}); "
                               "reload it and try again.", code="task_version_conflict")
            cadence_changed = clear_interval or (
                interval_seconds is not None and interval_seconds != row.interval_seconds)
            if name is not None:
                row.name = name
            if prompt is not None:
                row.prompt = prompt
            if clear_interval:
                row.interval_seconds = None
            elif interval_seconds is not None:
                row.interval_seconds = interval_seconds
            resumed = status == "active" and row.status == "paused"
            if status is not None:
                row.status = status
            if row.status != "active" or row.interval_seconds is None:
                row.next_due_at = None
            elif cadence_changed or resumed or row.next_due_at is None:
                row.next_due_at = now + timedelta(seconds=row.interval_seconds)
            row.version += 1
            row.updated_at = now
            await tx.audit(owner, TASK_AUDIT_ACTIONS["updated"],
                           {"task_id": task_id, "version": row.version,
                            "status": row.status}, conversation_id=row.conversation_id)
            return _task(row)

    async def delete(self, owner: str, task_id: str) -> None:
        async with self.store.transaction() as tx:
            row = await self._owned_row(tx, owner, task_id)
            conversation_id = row.conversation_id
            await tx.session.execute(delete(m.Task).where(m.Task.id == task_id))
            await tx.audit(owner, TASK_AUDIT_ACTIONS["deleted"], {"task_id": task_id},
                           conversation_id=conversation_id)

    async def firings_of(self, owner: str, task_id: str, limit: int = 20) -> list[FiringRecord]:
        """The task's latest firings, newest first, each with its run's status."""
        async with self.store.transaction() as tx:
            task = await self._owned_row(tx, owner, task_id)
            rows = (await tx.session.execute(
                select(m.TaskFiring, m.Run.status)
                .outerjoin(m.Run, m.Run.id == m.TaskFiring.run_id)
                .where(m.TaskFiring.task_id == task_id)
                .order_by(m.TaskFiring.created_at.desc(), m.TaskFiring.id)
                .limit(limit))).all()
            return [_firing(f, conversation_id=task.conversation_id, run_status=status)
                    for f, status in rows]

    # --- firing -----------------------------------------------------------------------------

    async def fire_now(self, owner: str, task_id: str, *, kind: str,
                       key: str | None = None) -> FiringRecord:
        """The owner's "run now", "safe test" or one background attempt: a firing and its
        accepted input. The same ``key`` answers the earlier firing (a retried request)."""
        if kind not in ("run_now", "safe_test", "background"):
            raise ValueError(f"not a manual firing kind: {kind}")
        if key is not None and not _KEY.fullmatch(key):
            raise SchemaViolation("An idempotency key is 1-160 letters, digits or ._:-",
                                  code="schema_violation")
        posture = "task_test" if kind == "safe_test" else "task_run"
        firing_key = f"{kind}:{key}" if key is not None else f"{kind}:{new_id()}"
        now = utcnow()
        try:
            async with self.store.transaction() as tx:
                task = await self._owned_row(tx, owner, task_id)
                # The owner must still be in the room: fail before anything is written.
                await self.store.conversations.get_for(task.conversation_id, owner, tx)
                row = m.TaskFiring(id=new_id(), task_id=task_id, key=firing_key, kind=kind,
                                   posture=posture, due_at=now, task_version=task.version,
                                   created_at=now)
                tx.session.add(row)
                await tx.session.flush()
                firing = _firing(row, conversation_id=task.conversation_id)
        except IntegrityError:
            if key is None:
                raise
            earlier = await self._by_key(owner, task_id, firing_key)
            if earlier is None:
                raise
            firing = earlier
        return await self.complete(firing)

    async def _by_key(self, owner: str, task_id: str, key: str) -> FiringRecord | None:
        async with self.store.transaction() as tx:
            task = await self._owned_row(tx, owner, task_id)
            row = (await tx.session.execute(select(m.TaskFiring).where(
                m.TaskFiring.task_id == task_id, m.TaskFiring.key == key))).scalar_one_or_none()
            return None if row is None else _firing(row, conversation_id=task.conversation_id)

    async def due(self, now: datetime, limit: int = 50) -> list[tuple[str, datetime]]:
        """(task id, due time) of active tasks due by ``now``, earliest first."""
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.Task.id, m.Task.next_due_at)
                .where(m.Task.status == "active", m.Task.next_due_at.is_not(None),
                       m.Task.next_due_at <= now)
                .order_by(m.Task.next_due_at).limit(limit))).all()
            return [(str(r[0]), r[1]) for r in rows if r[1] is not None]

    async def fire_due(self, task_id: str, due_at: datetime,
                       now: datetime | None = None) -> FiringRecord | None:
        """Fire the task's due time ``due_at`` once: None when another replica (or an edit)
        got there first. Due times missed meanwhile are coalesced into this firing."""
        now = now or utcnow()
        try:
            async with self.store.transaction() as tx:
                row = (await tx.session.execute(select(m.Task).where(
                    m.Task.id == task_id))).scalar_one_or_none()
                if row is None or row.interval_seconds is None:
                    return None
                following, missed = next_slot(due_at, row.interval_seconds, now)
                moved = await tx.session.execute(
                    update(m.Task)
                    .where(m.Task.id == task_id, m.Task.status == "active",
                           m.Task.next_due_at == due_at)
                    .values(next_due_at=following,
                            missed_firings=m.Task.missed_firings + missed))
                if moved.rowcount != 1:  # type: ignore[attr-defined]
                    return None  # fired elsewhere, edited, paused or deleted meanwhile
                firing = m.TaskFiring(
                    id=new_id(), task_id=task_id, key=f"due:{due_at.isoformat()}",
                    kind="scheduled", posture="task_run", due_at=due_at,
                    task_version=row.version, created_at=now)
                tx.session.add(firing)
                await tx.session.flush()
                record = _firing(firing, conversation_id=row.conversation_id)
        except IntegrityError:
            return None  # the unique (task, key): another replica fired this due time
        if missed:
            log.info("task %s: %d due time(s) passed while no server ran; fired once",
                     task_id, missed)
        return await self.complete(record)

    async def complete(self, firing: FiringRecord) -> FiringRecord:
        """Turn a firing into the owner's accepted input in the task's room (idempotent: the
        input's key is the firing's id), or record why it cannot be."""
        async with self.store.transaction() as tx:
            task = (await tx.session.execute(select(m.Task).where(
                m.Task.id == firing.task_id))).scalar_one_or_none()
            current = await tx.session.get(m.TaskFiring, firing.id)
        if task is None or current is None:
            return firing  # deleted with its task
        if current.run_id is not None or current.error is not None:
            return _firing(current, conversation_id=task.conversation_id)
        try:
            accepted: AcceptedInputRecord = await self.store.inputs.accept(
                task.conversation_id, task.owner, task.prompt, kind="message",
                idempotency_key=f"task-firing:{firing.id}")
        except NotFound:
            error = "The task's owner no longer takes part in its conversation."
            async with self.store.transaction() as tx:
                await tx.session.execute(update(m.TaskFiring).where(
                    m.TaskFiring.id == firing.id, m.TaskFiring.run_id.is_(None))
                    .values(error=error))
            log.warning("task %s could not fire: its owner left the room", firing.task_id)
            return dataclasses.replace(firing, error=error)
        async with self.store.transaction() as tx:
            await tx.session.execute(update(m.TaskFiring).where(
                m.TaskFiring.id == firing.id, m.TaskFiring.run_id.is_(None))
                .values(run_id=accepted.run_id))
            await tx.audit(task.owner, TASK_AUDIT_ACTIONS["fired"], {
                "task_id": task.id, "firing_id": firing.id, "kind": firing.kind,
                "posture": firing.posture}, conversation_id=task.conversation_id,
                run_id=accepted.run_id)
        return dataclasses.replace(firing, run_id=accepted.run_id, run_status="queued",
                                   conversation_id=task.conversation_id)

    async def unfinished_firings(self, now: datetime | None = None) -> list[FiringRecord]:
        """Firings whose writer crashed before their input was accepted."""
        cutoff = (now or utcnow()) - UNFINISHED_AFTER
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.TaskFiring).where(m.TaskFiring.run_id.is_(None),
                                           m.TaskFiring.error.is_(None),
                                           m.TaskFiring.created_at <= cutoff)
                .limit(50))).scalars().all()
            return [_firing(r) for r in rows]

    # --- what a task's run is -------------------------------------------------------------

    async def posture_of(self, run_id: str) -> str:
        """``task_run`` / ``task_test`` for a task's run, ``chat`` for any other (R-053)."""
        async with self.store.transaction() as tx:
            posture = (await tx.session.execute(select(m.TaskFiring.posture).where(
                m.TaskFiring.run_id == run_id))).scalar_one_or_none()
            return CHAT_POSTURE if posture is None else str(posture)

    async def firing_of_run(self, run_id: str) -> FiringRecord | None:
        async with self.store.transaction() as tx:
            row = (await tx.session.execute(select(m.TaskFiring).where(
                m.TaskFiring.run_id == run_id))).scalar_one_or_none()
            return None if row is None else _firing(row)

    async def current_authority(self, run_id: str, member: str) -> TaskAuthority | None:
        """The task authority of ``run_id`` read now, or None when it is gone: the task was
        deleted or edited since it fired, or its owner is not ``member`` or no longer in the
        room. Never answered from anything stored at firing time alone (R-057)."""
        async with self.store.transaction() as tx:
            row = (await tx.session.execute(
                select(m.TaskFiring.task_id, m.TaskFiring.posture, m.TaskFiring.task_version,
                       m.Task.owner, m.Task.version)
                .join(m.Task, m.Task.id == m.TaskFiring.task_id)
                .join(m.Participant, and_(
                    m.Participant.conversation_id == m.Task.conversation_id,
                    m.Participant.member_id == m.Task.owner))
                .where(m.TaskFiring.run_id == run_id))).first()
        if row is None:
            return None
        task_id, posture, fired_version, owner, version = row
        if owner != member or version != fired_version:
            return None
        return TaskAuthority(str(task_id), str(owner), str(posture), int(fired_version))

