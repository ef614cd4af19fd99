"""The durable completion inbox: one row per notice, member-scoped reads and acknowledgements.

Rows are written only by trusted producers (``lanes.inbox``); members read and acknowledge
their own. Another member's notice looks exactly like a missing one (NotFound, never 403).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import bindparam, select, update

from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import new_id, utcnow
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, select_rows

MAX_PAGE = 200


@dataclass(frozen=True, slots=True)
class NotificationRecord:
    id: str
    member: str
    kind: str
    resource_id: str
    run_id: str | None
    attendance: str
    status: str
    title: str
    created_at: datetime
    acked_at: datetime | None

    def public(self) -> dict[str, Any]:
        destination: dict[str, Any] = {"kind": self.kind}
        if self.kind == "chat":
            destination.update(conversation_id=self.resource_id, run_id=self.run_id)
        elif self.kind == "prompt":
            destination.update(prompt_id=self.resource_id, run_id=self.run_id)
        else:
            destination.update(task_id=self.resource_id, run_id=self.run_id)
        return {
            "id": self.id,
            "destination": destination,
            "status": self.status,
            "title": self.title,
            "attendance": self.attendance,
            "created_at": self.created_at.isoformat(),
            "acked_at": self.acked_at.isoformat() if self.acked_at else None,
            "unread": self.acked_at is None,
        }


_NOTIFICATIONS = m.Base.metadata.tables[m.Notification.__tablename__]
_COLUMNS = ("id", "member", "kind", "resource_id", "run_id", "attendance", "status", "title",
            "created_at", "acked_at")


@cache
def _insert_once(dialect: str) -> Any:
    """INSERT … ON CONFLICT (member, dedupe_key) DO NOTHING RETURNING the row, in the
    dialect's own spelling (built once, on first use)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        insert: Any = pg_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        insert = sqlite_insert
    columns = [c for c in _NOTIFICATIONS.c if c.name != "acked_at"]
    return (insert(_NOTIFICATIONS)
            .values({c.name: bindparam(f"b_{c.name}") for c in columns})
            .on_conflict_do_nothing(index_elements=["member", "dedupe_key"])
            .returning(*(_NOTIFICATIONS.c[name] for name in _COLUMNS)))


def _inserted(statement: Any, values: dict[str, Any]) -> Unit[NotificationRecord | None]:
    rows = yield from select_rows(statement, values)
    return NotificationRecord(*rows[0]) if rows else None


def _record(row: m.Notification) -> NotificationRecord:
    return NotificationRecord(row.id, row.member, row.kind, row.resource_id, row.run_id,
                              row.attendance, row.status, row.title, row.created_at,
                              row.acked_at)


class NotificationRepository:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def insert(self, *, member: str, kind: str, resource_id: str, run_id: str | None,
                     attendance: str, status: str, title: str,
                     dedupe_key: str) -> NotificationRecord | None:
        """Insert one notice; None when this member already has one for ``dedupe_key``
        (two processes reporting one settlement write one row)."""
        values = {"b_id": new_id(), "b_member": member, "b_kind": kind,
                  "b_resource_id": resource_id, "b_run_id": run_id,
                  "b_attendance": attendance, "b_status": status, "b_title": title,
                  "b_dedupe_key": dedupe_key, "b_created_at": utcnow()}
        return await self.store.run(_inserted(_insert_once(self.store.engine.dialect.name),
                                              values))

    async def list_for(self, member: str, *, unread_only: bool,
                       limit: int = MAX_PAGE) -> list[NotificationRecord]:
        """The member's notices, newest first."""
        async with self.store.transaction() as tx:
            query = select(m.Notification).where(m.Notification.member == member)
            if unread_only:
                query = query.where(m.Notification.acked_at.is_(None))
            rows = (await tx.session.execute(
                query.order_by(m.Notification.created_at.desc(), m.Notification.id.desc())
                .limit(limit)
            )).scalars().all()
            return [_record(r) for r in rows]

    async def ack(self, notification_id: str, member: str) -> NotificationRecord:
        """Mark the member's own notice read (idempotent); anyone else's is NotFound."""
        async with self.store.transaction() as tx:
            row = (await tx.session.execute(
                update(m.Notification)
                .where(m.Notification.id == notification_id, m.Notification.member == member,
                       m.Notification.acked_at.is_(None))
                .values(acked_at=utcnow())
                .returning(m.Notification)
            )).scalar_one_or_none()
            if row is None:
                row = (await tx.session.execute(
                    select(m.Notification).where(m.Notification.id == notification_id,
                                                 m.Notification.member == member)
                )).scalar_one_or_none()
            if row is None:
                raise NotFound("No such notification.", code="notification_not_found")
            return _record(row)

    async def ack_destination(self, member: str, *, kind: str, resource_id: str,
                              run_id: str | None = None) -> list[NotificationRecord]:
        """Mark read the member's unread notices of exactly this destination (kind and
        resource id compared for equality, the run too when given) and return them: a
        client acknowledges only the destination it actually has open (R-033)."""
        conditions = [m.Notification.member == member, m.Notification.kind == kind,
                      m.Notification.resource_id == resource_id,
                      m.Notification.acked_at.is_(None)]
        if run_id is not None:
            conditions.append(m.Notification.run_id == run_id)
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                update(m.Notification).where(*conditions).values(acked_at=utcnow())
                .returning(m.Notification)
            )).scalars().all()
            return sorted((_record(r) for r in rows), key=lambda r: (r.created_at, r.id))
