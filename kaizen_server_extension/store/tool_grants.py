""""Allow for this conversation": a member's standing answer to the approval gate for one tool.

A grant is made only by the member's own decision on an approval request of that tool
(``StoreApprovals.decide`` with ``scope="conversation"``, in the decision's transaction), is
keyed by (member, conversation, tool) — the table's primary key, so it exists once and never
answers for another member or room — and is read with the call's other facts in the statement
that journals the call (``store/calls.py: open_call``). Revoking deletes the row; the next call
asks again. Both are audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from kaizen_server_extension.protocol.errors import NotFound, SchemaViolation
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, utcnow
from kaizen_server_extension.store.store import Store

GRANT_AUDIT_ACTION = "tool.grant"
REVOKE_AUDIT_ACTION = "tool.grant.revoked"


@dataclass(frozen=True, slots=True)
class ToolGrantRecord:
    member: str
    conversation_id: str
    tool: str
    capability: str
    approval_id: str | None
    granted_at: datetime

    def public(self) -> dict[str, Any]:
        return {"tool": self.tool, "capability": self.capability,
                "conversation_id": self.conversation_id, "approval_id": self.approval_id,
                "granted_at": self.granted_at.isoformat()}


def _record(row: m.ConversationToolGrant) -> ToolGrantRecord:
    return ToolGrantRecord(row.member, row.conversation_id, row.tool, row.capability,
                           row.approval_id, row.granted_at)


class NotGrantable(SchemaViolation):
    """A conversation grant was asked for a tool that confirms every call."""


async def grant_in(tx: Tx, *, member: str, conversation_id: str, tool: str, capability: str,
                   approval_id: str) -> None:
    """Record the grant in ``tx`` (the approval decision's transaction); a grant that already
    exists stays as it was. Raises :class:`NotGrantable` before anything is written for any
    tool but a write (``policy/approvals.py: grantable``; the table's CHECK holds the same)."""
    if capability != m.GRANTABLE_CAPABILITY:
        raise NotGrantable(
            "This tool asks every time and cannot be allowed for the whole conversation; "
            "approve or deny this call.", code="grant_not_allowed")
    dialect = tx.session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    await tx.session.execute(
        insert(m.ConversationToolGrant).values(
            member=member, conversation_id=conversation_id, tool=tool, capability=capability,
            approval_id=approval_id, granted_at=utcnow())
        .on_conflict_do_nothing(index_elements=["member", "conversation_id", "tool"]))
    await tx.audit(member, GRANT_AUDIT_ACTION, {"tool": tool, "approval_id": approval_id},
                   conversation_id=conversation_id)


class ToolGrants:
    """The REST side: a member's own grants in one conversation they take part in."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def list_for(self, member: str, conversation_id: str) -> list[ToolGrantRecord]:
        async with self.store.transaction() as tx:
            # Not a participant (or no such room): the same NotFound as everywhere.
            await self.store.conversations.get_for(conversation_id, member, tx)
            rows = (await tx.session.execute(
                select(m.ConversationToolGrant)
                .where(m.ConversationToolGrant.member == member,
                       m.ConversationToolGrant.conversation_id == conversation_id)
                .order_by(m.ConversationToolGrant.granted_at, m.ConversationToolGrant.tool)
            )).scalars().all()
            return [_record(r) for r in rows]

    async def revoke(self, member: str, conversation_id: str, tool: str) -> ToolGrantRecord:
        """Delete the member's grant; the next call of ``tool`` asks again. NotFound when
        there is none (or the room is not theirs to see)."""
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, member, tx)
            row = (await tx.session.execute(
                delete(m.ConversationToolGrant)
                .where(m.ConversationToolGrant.member == member,
                       m.ConversationToolGrant.conversation_id == conversation_id,
                       m.ConversationToolGrant.tool == tool)
                .returning(m.ConversationToolGrant)
            )).scalar_one_or_none()
            if row is None:
                raise NotFound("You have not allowed that tool in this conversation.",
                               code="grant_not_found")
            record = _record(row)
            await tx.audit(member, REVOKE_AUDIT_ACTION, {"tool": tool},
                           conversation_id=conversation_id)
            return record
