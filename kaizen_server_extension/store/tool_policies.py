"""Admin tool policies (``tool_policies``): list, set and delete, each change audited.

The pipeline reads these rows on every tool call (``host/store_ports.py``), so a change made here
takes effect on the next call of a running turn. A row denies or allows one tool for one member,
or for everyone with member ``*``; the member's own row overrides the everyone row, and no row
allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.store import Store

EVERYONE = "*"


@dataclass(frozen=True, slots=True)
class ToolPolicyRecord:
    tool: str
    member: str
    allowed: bool
    updated_by: str
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return {"tool": self.tool, "member": self.member, "allowed": self.allowed,
                "updated_by": self.updated_by, "updated_at": self.updated_at.isoformat()}


def _record(row: m.ToolPolicy) -> ToolPolicyRecord:
    return ToolPolicyRecord(row.tool, row.member, bool(row.allowed), row.updated_by,
                            row.updated_at)


class ToolPolicyAdmin:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def list(self, *, tool: str | None = None,
                   member: str | None = None) -> list[ToolPolicyRecord]:
        query = select(m.ToolPolicy)
        if tool is not None:
            query = query.where(m.ToolPolicy.tool == tool)
        if member is not None:
            query = query.where(m.ToolPolicy.member == member)
        async with self._store.transaction() as tx:
            rows = (await tx.session.execute(
                query.order_by(m.ToolPolicy.tool, m.ToolPolicy.member))).scalars().all()
            return [_record(r) for r in rows]

    async def set(self, tool: str, member: str, allowed: bool, *,
                  admin: str) -> ToolPolicyRecord:
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.ToolPolicy, (tool, member))
            now = utcnow()
            if row is None:
                row = m.ToolPolicy(tool=tool, member=member, allowed=allowed,
                                   updated_by=admin, updated_at=now)
                tx.session.add(row)
            else:
                row.allowed, row.updated_by, row.updated_at = allowed, admin, now
            await tx.audit(admin, "tool.policy", {"tool": tool, "member": member,
                                                  "allowed": allowed})
            return ToolPolicyRecord(tool, member, allowed, admin, now)

    async def delete(self, tool: str, member: str, *, admin: str) -> None:
        """Remove one row (the default, allowed, applies again); a missing row is a 404."""
        async with self._store.transaction() as tx:
            removed = (await tx.session.execute(
                delete(m.ToolPolicy)
                .where(m.ToolPolicy.tool == tool, m.ToolPolicy.member == member)
                .returning(m.ToolPolicy.tool)
            )).first()
            if removed is None:
                raise NotFound("There is no policy for that tool and member.",
                               code="policy_not_found")
            await tx.audit(admin, "tool.policy.deleted", {"tool": tool, "member": member})
