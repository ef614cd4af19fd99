"""Files a member attaches to a message: resolved, authorized and pinned at acceptance.

``pin`` runs inside the acceptance transaction, before anything is written: every id must
name an artifact the sender may read under the ordinary artifact rules (the owner, or a
version bound to exactly this shared room, R-090), else the whole request is the same
NotFound a missing id gets and nothing is stored. What is pinned is the latest *completed*
immutable version the sender may see: streaming checkpoints and staged drafts live in their
own tables and are never artifact versions, so they cannot be pinned (R-449); the composite
foreign key onto ``artifact_versions`` is the database's own guarantee.

``for_input`` (trusted: the lane at admission) reads the pinned list back as
:class:`SharedResource` records, which is all the sandbox ever gets to know about them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy import bindparam, select

from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.resources import (
    ARTIFACT_REFERENCE,
    MAX_ATTACHMENTS,
    AdmittedResources,
    SharedResource,
)
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, ArtifactVersionRecord
from kaizen_server_extension.store.core import Tx
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, select_rows

_ATTACHMENTS = m.Base.metadata.tables[m.InputAttachment.__tablename__]
_PINNED = (select(_ATTACHMENTS.c.artifact_id, _ATTACHMENTS.c.kind, _ATTACHMENTS.c.version,
                  _ATTACHMENTS.c.digest, _ATTACHMENTS.c.filename, _ATTACHMENTS.c.media_type,
                  _ATTACHMENTS.c.size)
           .where(_ATTACHMENTS.c.input_id == bindparam("b_input_id"))
           .order_by(_ATTACHMENTS.c.ordinal))


def pinned_resources(input_id: str) -> Unit[AdmittedResources]:
    """The input's pinned attachments as the sandbox may know them (a read unit)."""
    rows = yield from select_rows(_PINNED, {"b_input_id": input_id})
    return AdmittedResources.of([
        SharedResource(reference_id=artifact_id, kind=kind, version=version, sha256=digest,
                       filename=filename, media_type=media_type, size=int(size))
        for artifact_id, kind, version, digest, filename, media_type, size in rows])


_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")
_MAX_STEM = 120
# Extensions a text artifact's file gets by kind, so programs can tell formats apart.
_EXTENSIONS = {"markdown": ".md", "html": ".html", "svg": ".svg", "code": ".txt",
               "mermaid": ".mmd", "react": ".jsx", "json": ".json", "graph": ".json"}


def projection_filename(record: ArtifactVersionRecord) -> str:
    """A safe, flat file name for the projected copy (no separators, no leading dot)."""
    raw = record.source_name or record.title
    name = _UNSAFE.sub("_", raw).strip(" ._")[:_MAX_STEM] or "file"
    extension = _EXTENSIONS.get(record.kind, "")
    if record.governed:
        extension = ".json"
    if extension and not name.lower().endswith(extension):
        name += extension
    return name


def _unique(names: Sequence[str]) -> list[str]:
    """Distinct file names in order: a repeated name gets its position as a prefix."""
    seen: set[str] = set()
    out: list[str] = []
    for index, name in enumerate(names, start=1):
        candidate = name if name not in seen else f"{index}-{name}"
        seen.add(candidate)
        out.append(candidate)
    return out


class AttachmentStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.artifacts = ArtifactStore(store)

    async def pin(self, tx: Tx, member: str, conversation_id: str,
                  artifact_ids: Sequence[str]) -> list[SharedResource]:
        """Resolve ``artifact_ids`` as ``member`` for this room; NotFound for any that is
        missing or not readable (indistinguishable, R-126). Nothing is written here."""
        if len(artifact_ids) > MAX_ATTACHMENTS or len(set(artifact_ids)) != len(artifact_ids):
            raise ValueError("attachments must be at most 8 distinct ids")  # schema-checked
        records = []
        for artifact_id in artifact_ids:
            try:
                records.append(await self.artifacts.resolve(member, artifact_id,
                                                            room=conversation_id, tx=tx))
            except NotFound:
                raise NotFound("No such artifact.", code="attachment_not_found") from None
        names = _unique([projection_filename(r) for r in records])
        return [SharedResource(reference_id=r.artifact_id, kind=ARTIFACT_REFERENCE,
                               version=r.version, sha256=r.digest, filename=name,
                               media_type=r.mime, size=r.size)
                for r, name in zip(records, names, strict=True)]

    @staticmethod
    def record(tx: Tx, input_id: str, resources: Sequence[SharedResource]) -> None:
        """Add the pinned rows of an input (same transaction as the input itself)."""
        for ordinal, resource in enumerate(resources):
            tx.session.add(m.InputAttachment(
                input_id=input_id, ordinal=ordinal, artifact_id=resource.reference_id,
                version=resource.version, kind=resource.kind, digest=resource.sha256,
                size=resource.size, filename=resource.filename,
                media_type=resource.media_type))

    @staticmethod
    async def ids_of(tx: Tx, input_id: str) -> list[str]:
        rows = await tx.session.execute(
            select(m.InputAttachment.artifact_id).where(m.InputAttachment.input_id == input_id)
            .order_by(m.InputAttachment.ordinal))
        return [str(r) for r in rows.scalars().all()]

    async def for_input(self, input_id: str) -> AdmittedResources:
        """The pinned list of an accepted input, in attachment order (trusted callers)."""
        return await self.store.read(pinned_resources, input_id, single_statement=True)

    async def audit_admitted(self, member: str, conversation_id: str, run_id: str,
                             admitted: AdmittedResources) -> None:
        """The run audit's bounded resource list: ids, versions, digests, sizes (R-457)."""
        async with self.store.transaction() as tx:
            await tx.audit(member, "run.resources", admitted.audit(),
                           conversation_id=conversation_id, run_id=run_id)
