"""Members' external OpenAPI sources (``openapi_sources``): pointers only, each change audited.

A row is the whole of what is stored about a source (R-376): its id, owner, schema URL, API
base, cross-origin consent and enabled state — never the schema, a response or a credential.
Every read names the owner, so one member's source is another's 404 (never 403), and a call
of a source tool reads exactly its own row (R-400). At most 100 sources per member (R-402):
the database holds the bound (``slot``, migration 0017).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.settings import OPENAPI_SOURCE_URL_MAX_CHARS
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.store import Store

MAX_SOURCES = m.MAX_OPENAPI_SOURCES_PER_MEMBER
#: The longest schema URL or API base (the columns' width).
MAX_URL_CHARS = OPENAPI_SOURCE_URL_MAX_CHARS


class SourceNotFound(NotFound):
    default_code = "source_not_found"


class SourceLimitReached(Conflict):
    default_code = "source_limit_reached"


def new_source_id() -> str:
    """``s`` and 10 hex digits: short enough to leave a tool name room for the operation."""
    return "s" + secrets.token_hex(5)


@dataclass(frozen=True, slots=True)
class SourceRecord:
    id: str
    owner: str
    schema_url: str
    api_base: str
    cross_origin: bool
    enabled: bool
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "owner": self.owner, "schema_url": self.schema_url,
                "api_base": self.api_base, "cross_origin": self.cross_origin,
                "enabled": self.enabled, "created_at": self.created_at.isoformat(),
                "updated_at": self.updated_at.isoformat()}


def _record(row: m.OpenApiSource) -> SourceRecord:
    return SourceRecord(row.id, row.owner, row.schema_url, row.api_base,
                        bool(row.cross_origin), bool(row.enabled), row.created_at,
                        row.updated_at)


_MISSING = "There is no such source of yours."
#: What authorized a change the member made through the REST routes themselves; a change
#: made by ``manage_openapi_sources`` records the pipeline's fact instead (R-377).
MEMBER_REQUEST: Mapping[str, Any] = {"by": "member_request"}


class OpenApiSourceStore:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def create(self, owner: str, *, schema_url: str, api_base: str,
                     cross_origin: bool, enabled: bool = True,
                     authorization: Mapping[str, Any] = MEMBER_REQUEST) -> SourceRecord:
        """A new source in the owner's lowest free slot; the 101st is refused. The audit row
        records ``authorization``: what allowed the change (R-377)."""
        limit = SourceLimitReached(f"You already have {MAX_SOURCES} sources; delete one "
                                   "before adding another.")
        try:
            async with self._store.transaction() as tx:
                await self._store.members.ensure(owner, tx=tx)
                used = set((await tx.session.execute(
                    select(m.OpenApiSource.slot).where(m.OpenApiSource.owner == owner)
                )).scalars().all())
                slot = next((s for s in range(MAX_SOURCES) if s not in used), None)
                if slot is None:
                    raise limit
                now = utcnow()
                row = m.OpenApiSource(id=new_source_id(), owner=owner, slot=slot,
                                      schema_url=schema_url, api_base=api_base,
                                      cross_origin=cross_origin, enabled=enabled,
                                      created_at=now, updated_at=now)
                tx.session.add(row)
                await tx.session.flush()
                await tx.audit(owner, "openapi_source.created",
                               _audited(row, authorization))
                return _record(row)
        except IntegrityError:
            # A concurrent registration took the slot: at the limit that is the limit, below
            # it the member may simply try again.
            raise Conflict("Another source was registered at the same moment; try again.",
                           code="source_conflict") from None

    async def list_for(self, owner: str) -> list[SourceRecord]:
        async with self._store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.OpenApiSource).where(m.OpenApiSource.owner == owner)
                .order_by(m.OpenApiSource.created_at, m.OpenApiSource.id))).scalars().all()
            return [_record(r) for r in rows]

    async def enabled_for(self, owner: str) -> list[SourceRecord]:
        return [s for s in await self.list_for(owner) if s.enabled]

    async def get_for(self, source_id: str, owner: str) -> SourceRecord:
        """The owner's source ``source_id`` — this one row only (R-400)."""
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                select(m.OpenApiSource).where(m.OpenApiSource.id == source_id,
                                              m.OpenApiSource.owner == owner))
            ).scalar_one_or_none()
            if row is None:
                raise SourceNotFound(_MISSING)
            return _record(row)

    async def exists(self, source_id: str) -> bool:
        """Whether any member has a source ``source_id`` (for admin policy names)."""
        async with self._store.transaction() as tx:
            return (await tx.session.get(m.OpenApiSource, source_id)) is not None

    async def update(self, source_id: str, owner: str, *, schema_url: str, api_base: str,
                     cross_origin: bool, enabled: bool,
                     authorization: Mapping[str, Any] = MEMBER_REQUEST) -> SourceRecord:
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                select(m.OpenApiSource).where(m.OpenApiSource.id == source_id,
                                              m.OpenApiSource.owner == owner)
                .with_for_update())).scalar_one_or_none()
            if row is None:
                raise SourceNotFound(_MISSING)
            row.schema_url, row.api_base = schema_url, api_base
            row.cross_origin, row.enabled = cross_origin, enabled
            row.updated_at = utcnow()
            await tx.audit(owner, "openapi_source.updated", _audited(row, authorization))
            return _record(row)

    async def delete(self, source_id: str, owner: str, *,
                     authorization: Mapping[str, Any] = MEMBER_REQUEST) -> None:
        async with self._store.transaction() as tx:
            removed = (await tx.session.execute(
                delete(m.OpenApiSource)
                .where(m.OpenApiSource.id == source_id, m.OpenApiSource.owner == owner)
                .returning(m.OpenApiSource.id))).first()
            if removed is None:
                raise SourceNotFound(_MISSING)
            await tx.audit(owner, "openapi_source.deleted",
                           {"source": source_id, "authorization": dict(authorization)})


def _audited(row: m.OpenApiSource, authorization: Mapping[str, Any]) -> dict[str, Any]:
    return {"source": row.id, "schema_url": row.schema_url, "api_base": row.api_base,
            "cross_origin": bool(row.cross_origin), "enabled": bool(row.enabled),
            "authorization": dict(authorization)}
