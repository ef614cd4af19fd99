"""The versioned artifact store: immutable versions, owner scope, exact-room scope.

* A root (``artifacts``) names its owner and latest version number; every change appends one
  immutable ``artifact_versions`` row (a trigger refuses UPDATE) in the same transaction as the
  root's compare-and-set and the journal's ``artifact.version`` event.
* The version check is optimistic under a lock: the root row is locked (``FOR UPDATE`` on
  PostgreSQL; SQLite transactions are ``BEGIN IMMEDIATE``), the caller's expected version is
  compared, and the bump is itself conditional. Two updates racing on one version: one wins,
  the other is a 409 and writes nothing (R-093).
* Titles: the artifact's current title lives on the root; a rename changes only the root
  (no new version), so every read, listing and download shows it. Each version keeps the
  title it was created with (``version_title``), its own history.
* Reading: the owner sees every version. Anyone else sees only versions bound to a shared room
  they currently participate in — the exact room reference, never the title or the root
  (R-090). Everything else is NotFound, never 403.
* The reserved renderable pair needs a server attestation; the database CHECK enforces the
  same (R-119), so ordinary writes cannot mint it whatever the caller passes. The stored
  marker names the approved producer (an MCP artifact tool, docs/mcp.md), which the record's
  ``attested`` shows with the one thing the attestation asserts: validated output of that
  producer, never that its provenance or markings are true (R-403). A fork keeps the marker,
  so a copy still names the producer whose output it is (R-118).
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.content import (
    ATTESTATION_ASSERTS,
    Attestation,
    Envelope,
    ValidationFailed,
    check_content,
    is_reserved,
    producer_of,
    verify_attestation,
)
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.storable import UnstorableText
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.units import Unit, fetch

ARTIFACT_VERSION_EVENT = "artifact.version"
MAX_FILE_BYTES = 25 * 1024 * 1024
TEXT_MIME = {
    "markdown": "text/markdown", "html": "text/html", "svg": "image/svg+xml",
    "code": "text/plain", "mermaid": "text/vnd.mermaid", "react": "text/jsx",
    "json": "application/json", "graph": "application/vnd.kaizen.graph+json",
}
GOVERNED_MIME = "application/vnd.kaizen.renderable+json"
_TABLES = m.Base.metadata.tables
_VERSIONS = _TABLES[m.ArtifactVersion.__tablename__]
_ROOTS = _TABLES[m.Artifact.__tablename__]
_CHECKPOINTS = _TABLES[m.ArtifactUpdateCheckpoint.__tablename__]
_PARTICIPANTS = _TABLES[m.Participant.__tablename__]
# Whether ``member`` takes part in the room, and whether the room's roster could hold
# anything for them: a version bound to the room, an artifact of theirs made there, or an
# open update of theirs there. Each an index lookup.
_ROOM_ARTIFACTS = select(
    exists().where(_PARTICIPANTS.c.conversation_id == bindparam("b_room"),
                   _PARTICIPANTS.c.member_id == bindparam("b_member")),
    or_(exists().where(_VERSIONS.c.room_id == bindparam("b_room")),
        exists().where(_ROOTS.c.owner == bindparam("b_member"),
                       _ROOTS.c.conversation_id == bindparam("b_room")),
        exists().where(_CHECKPOINTS.c.owner == bindparam("b_member"),
                       _CHECKPOINTS.c.conversation_id == bindparam("b_room"),
                       or_(*(_CHECKPOINTS.c.status == status
                             for status in m.OPEN_CHECKPOINT_STATUSES)))))


def room_may_list_artifacts(member: str, room: str) -> Unit[bool]:
    """False only when ``member`` takes part in ``room`` and the room has nothing its roster
    could list for them (most rooms): the roster is then known empty without reading it."""
    rows = yield from fetch(_ROOM_ARTIFACTS, {"b_member": member, "b_room": room})
    participant, anything = rows[0]
    return not participant or bool(anything)


_NOT_FOUND = "No such artifact."
_ALREADY_DERIVED = "You already have your own copy of that exact version; nothing was saved."


def content_digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@dataclass(frozen=True, slots=True)
class ArtifactVersionRecord:
    artifact_id: str
    owner: str
    version: int
    latest_version: int
    kind: str
    language: str | None
    #: The artifact's current title (the root's: a rename changes it for every version).
    title: str
    #: The title this version was created with (immutable, like the version).
    version_title: str
    mime: str
    digest: str
    size: int
    author: str
    conversation_id: str | None
    room_id: str | None
    run_id: str | None
    governed: bool
    derived_from: str | None
    source_name: str | None
    created_at: datetime
    content: bytes
    #: The approved producer a governed version's attestation names (None: none recorded).
    producer: str | None = None

    @property
    def attested(self) -> dict[str, Any] | None:
        """What a governed version's attestation asserts: that the named approved producer
        returned output that passed the envelope contract — not that its provenance or
        markings are true (R-403). None for an ordinary version."""
        if not self.governed:
            return None
        return {"producer": self.producer, "asserts": ATTESTATION_ASSERTS}

    @property
    def is_text(self) -> bool:
        return self.kind != "file"

    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def public(self, *, content: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.artifact_id, "owner": self.owner, "version": self.version,
            "latest_version": self.latest_version, "kind": self.kind,
            "language": self.language, "title": self.title,
            "version_title": self.version_title, "mime": self.mime,
            "digest": self.digest, "size": self.size, "author": self.author,
            "conversation_id": self.conversation_id, "room_id": self.room_id,
            "governed": self.governed, "attested": self.attested,
            "derived_from": self.derived_from,
            "created_at": self.created_at.isoformat(),
        }
        if content and self.is_text:
            body["content"] = self.text()
        return body

    def event_data(self) -> dict[str, Any]:
        """What the journal carries: identity and digest, never the content."""
        return {"artifact_id": self.artifact_id, "version": self.version, "title": self.title,
                "kind": self.kind, "language": self.language, "digest": self.digest,
                "size": self.size, "owner": self.owner, "room_id": self.room_id,
                "governed": self.governed, "derived_from": self.derived_from}


def _utf8(content: bytes | str) -> bytes:
    if isinstance(content, bytes):
        return content
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError:
        raise UnstorableText("content") from None


def _record(root: m.Artifact, row: m.ArtifactVersion) -> ArtifactVersionRecord:
    return ArtifactVersionRecord(
        artifact_id=root.id, owner=root.owner, version=row.version,
        latest_version=root.current_version, kind=row.kind, language=row.language,
        title=root.title, version_title=row.title, mime=row.mime, digest=row.digest,
        size=row.size, author=row.author,
        conversation_id=row.conversation_id, room_id=row.room_id, run_id=row.run_id,
        governed=row.attestation is not None and is_reserved(row.kind, row.language),
        derived_from=root.derived_from, source_name=root.source_name,
        created_at=row.created_at, content=bytes(row.content),
        producer=producer_of(row.attestation) if is_reserved(row.kind, row.language) else None,
    )


@dataclass(frozen=True, slots=True)
class WriteContext:
    """Where a write happens: the acting run's room and run (both None for REST-only)."""

    conversation_id: str | None = None
    run_id: str | None = None


class ArtifactStore:
    """``ctx.services.artifacts.store``: every artifact read and write, as one member."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # --- reads ---------------------------------------------------------------------------

    async def resolve(self, member: str, artifact_id: str, *, version: int | None = None,
                      room: str | None = None, tx: Tx | None = None) -> ArtifactVersionRecord:
        """The version ``member`` may see: the owner any (latest by default); anyone else only
        one bound to a shared room they participate in (``room`` narrows it to that exact
        room). NotFound otherwise, indistinguishable from a missing id."""
        if tx is None:
            async with self.store.transaction() as own:
                return await self.resolve(member, artifact_id, version=version, room=room,
                                          tx=own)
        root = await tx.session.get(m.Artifact, artifact_id) if len(artifact_id) <= 64 else None
        if root is None:
            raise NotFound(_NOT_FOUND, code="artifact_not_found")
        query = select(m.ArtifactVersion).where(m.ArtifactVersion.artifact_id == artifact_id)
        if root.owner != member:
            query = query.join(m.Participant, and_(
                m.Participant.conversation_id == m.ArtifactVersion.room_id,
                m.Participant.member_id == member))
            if room is not None:
                query = query.where(m.ArtifactVersion.room_id == room)
        if version is not None:
            query = query.where(m.ArtifactVersion.version == version)
        row = (await tx.session.execute(
            query.order_by(m.ArtifactVersion.version.desc()).limit(1))).scalar_one_or_none()
        if row is None:
            raise NotFound(_NOT_FOUND, code="artifact_not_found")
        return _record(root, row)

    async def versions(self, member: str, artifact_id: str) -> list[int]:
        """The version numbers ``member`` may see, oldest first."""
        async with self.store.transaction() as tx:
            latest = await self.resolve(member, artifact_id, tx=tx)
            query = select(m.ArtifactVersion.version).where(
                m.ArtifactVersion.artifact_id == artifact_id)
            if latest.owner != member:
                query = query.join(m.Participant, and_(
                    m.Participant.conversation_id == m.ArtifactVersion.room_id,
                    m.Participant.member_id == member))
            rows = (await tx.session.execute(query.order_by(m.ArtifactVersion.version)))
            return [int(v) for v in rows.scalars().all()]

    async def list_for(self, member: str, *, room: str | None = None,
                       limit: int = 200) -> list[ArtifactVersionRecord]:
        """The member's own roots (latest version each), or, with ``room``, the latest
        version of each artifact bound to that room (participants only)."""
        async with self.store.transaction() as tx:
            if room is not None:
                await self.store.conversations.get_for(room, member, tx)
                ids = (await tx.session.execute(
                    select(m.ArtifactVersion.artifact_id)
                    .where(m.ArtifactVersion.room_id == room).distinct()
                )).scalars().all()
                own_here = (await tx.session.execute(
                    select(m.Artifact.id).where(m.Artifact.owner == member,
                                                m.Artifact.conversation_id == room)
                )).scalars().all()
                out = [await self.resolve(member, i, tx=tx)
                       for i in sorted(set(ids) | set(own_here))]
                return sorted(out, key=lambda r: r.created_at, reverse=True)[:limit]
            rows = (await tx.session.execute(
                select(m.Artifact, m.ArtifactVersion)
                .join(m.ArtifactVersion, and_(
                    m.ArtifactVersion.artifact_id == m.Artifact.id,
                    m.ArtifactVersion.version == m.Artifact.current_version))
                .where(m.Artifact.owner == member)
                .order_by(m.Artifact.updated_at.desc(), m.Artifact.id).limit(limit)
            )).all()
            return [_record(root, row) for root, row in rows]

    async def roster(self, member: str, conversation_id: str) -> list[dict[str, Any]]:
        """The conversation-scoped roster (R-253): identity only, this room's artifacts."""
        return [{"id": r.artifact_id, "title": r.title, "kind": r.kind, "version": r.version}
                for r in await self.list_for(member, room=conversation_id, limit=50)]

    # --- writes --------------------------------------------------------------------------

    async def create(self, owner: str, *, title: str, kind: str, content: bytes | str,
                     language: str | None = None, mime: str | None = None,
                     where: WriteContext | None = None, source_name: str | None = None,
                     derived_from: tuple[str, int] | None = None,
                     attestation: str | None = None,
                     tx: Tx | None = None) -> ArtifactVersionRecord:
        """A new root and its version 1, with the journal event, in one transaction."""
        if tx is None:
            async with self.store.transaction() as own:
                return await self.create(
                    owner, title=title, kind=kind, content=content, language=language,
                    mime=mime, where=where, source_name=source_name,
                    derived_from=derived_from, attestation=attestation, tx=own)
        where = where or WriteContext()
        data = self._checked(kind, language, content, attestation)
        room = await self._room_of(tx, owner, where.conversation_id)
        if derived_from is not None:
            await self._refuse_second_derivation(tx, owner, derived_from)
        now = utcnow()
        root = m.Artifact(
            id=new_id(), owner=owner, title=title, kind=kind,
            conversation_id=where.conversation_id, source_name=source_name,
            derived_from=derived_from[0] if derived_from else None,
            derived_version=derived_from[1] if derived_from else None,
            current_version=1, created_at=now, updated_at=now)
        tx.session.add(root)
        try:
            await tx.session.flush()
        except IntegrityError:
            if derived_from is None:
                raise
            # A concurrent derivation won the unique index (uq_artifacts_one_derivation).
            raise Conflict(_ALREADY_DERIVED, code="already_derived") from None
        return await self._append_version(tx, root, 1, title=title, kind=kind,
                                          language=language, content=data, mime=mime,
                                          author=owner, where=where, room=room,
                                          attestation=attestation)

    async def update(self, member: str, artifact_id: str, *, content: bytes | str,
                     expected_version: int | None, title: str | None = None,
                     language: str | None = None, keep_language: bool = True,
                     where: WriteContext | None = None, attestation: str | None = None,
                     governed: Envelope | None = None,
                     tx: Tx | None = None) -> ArtifactVersionRecord:
        """Append the next version to a root the member owns (a foreign root is NotFound:
        R-254). ``expected_version`` is compared under the root's lock; a stale one is 409."""
        if tx is None:
            async with self.store.transaction() as own:
                return await self.update(
                    member, artifact_id, content=content, expected_version=expected_version,
                    title=title, language=language, keep_language=keep_language, where=where,
                    attestation=attestation, governed=governed, tx=own)
        where = where or WriteContext()
        root = await self._lock_owned(tx, member, artifact_id)
        latest = await self._version_row(tx, artifact_id, root.current_version)
        was_governed = latest.attestation is not None and is_reserved(latest.kind,
                                                                      latest.language)
        if was_governed and governed is None:
            # The ordinary path cannot put model-authored content into a governed root.
            raise ValidationFailed("This artifact is a governed result; it cannot be revised "
                                   "with ordinary content.")
        if governed is not None:
            if not was_governed:
                raise ValidationFailed("Only a governed artifact takes a governed update.")
            await self._check_same_binding(latest, governed)
        if expected_version is not None and root.current_version != expected_version:
            raise Conflict(
                f"The artifact is at version {root.current_version}, not {expected_version}; "
                "nothing was saved. Read it again and reapply the change.",
                code="version_conflict")
        new_language = latest.language if keep_language and language is None else language
        data = self._checked(root.kind, new_language, content, attestation)
        room = await self._room_of(tx, member, where.conversation_id)
        next_version = root.current_version + 1
        bumped = (await tx.session.execute(
            update(m.Artifact)
            .where(m.Artifact.id == artifact_id,
                   m.Artifact.current_version == root.current_version)
            .values(current_version=next_version, updated_at=utcnow(),
                    title=title or root.title)
            .returning(m.Artifact.id)
        )).scalar_one_or_none()
        if bumped is None:  # pragma: no cover - the lock makes this unreachable
            raise Conflict("The artifact changed meanwhile; nothing was saved.",
                           code="version_conflict")
        await tx.session.refresh(root)
        return await self._append_version(tx, root, next_version, title=title or root.title,
                                          kind=root.kind, language=new_language, content=data,
                                          mime=latest.mime, author=member, where=where,
                                          room=room, attestation=attestation)

    async def rename(self, member: str, artifact_id: str, title: str) -> ArtifactVersionRecord:
        """A member metadata route: owner-only (foreign is NotFound first, R-126); a governed
        artifact refuses with validation_failed and nothing changes (R-125). The new title is
        the root's, read back as stored; no version is appended and each keeps its own."""
        async with self.store.transaction() as tx:
            root = await self._lock_owned(tx, member, artifact_id)
            latest = await self._version_row(tx, artifact_id, root.current_version)
            if latest.attestation is not None and is_reserved(latest.kind, latest.language):
                raise ValidationFailed("A governed artifact cannot be renamed.")
            root.title = title
            root.updated_at = utcnow()
            await tx.session.flush()
            await tx.session.refresh(root)
            return _record(root, latest)

    async def fork(self, member: str, artifact_id: str, *, where: WriteContext,
                   room: str | None = None) -> ArtifactVersionRecord:
        """A new member-owned root holding the exact stored bytes, language and attestation of
        the visible version (R-117, R-118); it accepts no replacement content."""
        async with self.store.transaction() as tx:
            source = await self.resolve(member, artifact_id, room=room, tx=tx)
            row = await self._version_row(tx, artifact_id, source.version)
            return await self.create(
                member, title=source.title, kind=source.kind, content=bytes(row.content),
                language=row.language, mime=row.mime, where=where,
                derived_from=(artifact_id, source.version), attestation=row.attestation,
                tx=tx)

    async def create_governed(self, owner: str, envelope: Envelope, attestation: Attestation,
                              *, where: WriteContext) -> ArtifactVersionRecord:
        """The trusted result boundary's writer: only a matching call-scoped attestation
        stamps the marker the database requires (R-107, R-119)."""
        if not verify_attestation(attestation, envelope):
            raise ValidationFailed("The renderable artifact's attestation does not match.")
        return await self.create(
            owner, title=envelope.title, kind=m.RESERVED_ARTIFACT_KIND,
            content=envelope.canonical, language=m.RESERVED_ARTIFACT_LANGUAGE,
            mime=GOVERNED_MIME, where=where, attestation=attestation.marker)

    async def update_governed(self, owner: str, artifact_id: str, envelope: Envelope,
                              attestation: Attestation, *, expected_version: int | None,
                              where: WriteContext) -> ArtifactVersionRecord:
        """Revalidated envelope, same markings and provenance (R-116), fresh attestation."""
        if not verify_attestation(attestation, envelope):
            raise ValidationFailed("The renderable artifact's attestation does not match.")
        return await self.update(
            owner, artifact_id, content=envelope.canonical, expected_version=expected_version,
            title=envelope.title, where=where, attestation=attestation.marker,
            governed=envelope)

    async def persist_file(self, member: str, conversation_id: str, run_id: str | None,
                           name: str, content: bytes,
                           mime: str | None) -> tuple[ArtifactVersionRecord, bool]:
        """Store one run_code output file as the next version of the (member, conversation,
        name) root, or reuse the latest version when bytes and content type match (R-452).
        The root's unique key and row lock serialize the check and the insert (R-453)."""
        if len(content) > MAX_FILE_BYTES:
            raise ValidationFailed(f"The file {name!r} is larger than {MAX_FILE_BYTES} bytes.",
                                   code="artifact_too_large")
        mime = mime or mimetypes.guess_type(name)[0] or "application/octet-stream"
        digest = content_digest(content)
        where = WriteContext(conversation_id, run_id)
        for _attempt in range(3):
            try:
                async with self.store.transaction() as tx:
                    root = (await tx.session.execute(
                        select(m.Artifact).where(m.Artifact.owner == member,
                                                 m.Artifact.conversation_id == conversation_id,
                                                 m.Artifact.source_name == name)
                        .with_for_update())).scalar_one_or_none()
                    if root is None:
                        record = await self.create(
                            member, title=name, kind="file", content=content, mime=mime,
                            where=where, source_name=name, tx=tx)
                        return record, False
                    latest = await self._version_row(tx, root.id, root.current_version)
                    if latest.digest == digest and latest.mime == mime:
                        return _record(root, latest), True
                    record = await self.update(member, root.id, content=content,
                                               expected_version=root.current_version,
                                               where=where, tx=tx)
                    return record, False
            except IntegrityError:
                continue  # another call created the same root first: look again
        raise Conflict("The file could not be stored; nothing was saved.",
                       code="artifact_busy")

    # --- staged drafts (begin / append / finalize / discard) -----------------------------
    # Implemented in kaizen_server_extension.store.artifacts.drafts over these helpers.

    # --- helpers -------------------------------------------------------------------------

    @staticmethod
    def _checked(kind: str, language: str | None, content: bytes | str,
                 attestation: str | None) -> bytes:
        """The version's bytes. Content is stored as bytes, so U+0000 is kept exactly; an
        unpaired surrogate has no UTF-8 encoding and is refused (store/storable.py)."""
        if kind not in m.ARTIFACT_KINDS:
            raise ValidationFailed(f"Unknown artifact kind {kind!r}.")
        if is_reserved(kind, language):
            if attestation is None:
                raise ValidationFailed("That kind and language are reserved for governed "
                                       "results from trusted tools.",
                                       code="reserved_artifact_language")
            return _utf8(content)
        if kind == "file":
            return _utf8(content)
        if isinstance(content, bytes):
            try:
                text = content.decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationFailed("A text artifact must be UTF-8.") from None
        else:
            text = content
        return _utf8(check_content(kind, language, text))

    async def _room_of(self, tx: Tx, member: str, conversation_id: str | None) -> str | None:
        """The shared room a new version is bound to: the writer's current room, checked."""
        if conversation_id is None:
            return None
        conversation = await self.store.conversations.get_for(conversation_id, member, tx)
        return conversation.id if conversation.shared else None

    @staticmethod
    async def _refuse_second_derivation(tx: Tx, owner: str,
                                        derived_from: tuple[str, int]) -> None:
        """One member-owned remix or fork per exact source version (R-164); the database's
        partial unique index is the authority, this names the existing copy."""
        existing = (await tx.session.execute(
            select(m.Artifact.id).where(m.Artifact.owner == owner,
                                        m.Artifact.derived_from == derived_from[0],
                                        m.Artifact.derived_version == derived_from[1])
        )).scalar_one_or_none()
        if existing is not None:
            raise Conflict(f"{_ALREADY_DERIVED} Your copy is artifact {existing}; change that "
                           "one instead.", code="already_derived")

    async def lock_owned(self, tx: Tx, member: str, artifact_id: str) -> m.Artifact:
        """The member's own root, locked in ``tx`` (sibling stores: update checkpoints)."""
        return await self._lock_owned(tx, member, artifact_id)

    async def _lock_owned(self, tx: Tx, member: str, artifact_id: str) -> m.Artifact:
        root = (await tx.session.execute(
            select(m.Artifact).where(m.Artifact.id == artifact_id, m.Artifact.owner == member)
            .with_for_update()
        )).scalar_one_or_none() if len(artifact_id) <= 64 else None
        if root is None:
            raise NotFound(_NOT_FOUND, code="artifact_not_found")
        return root

    @staticmethod
    async def _version_row(tx: Tx, artifact_id: str, version: int) -> m.ArtifactVersion:
        return (await tx.session.execute(
            select(m.ArtifactVersion).where(m.ArtifactVersion.artifact_id == artifact_id,
                                            m.ArtifactVersion.version == version)
        )).scalar_one()

    @staticmethod
    async def _check_same_binding(latest: m.ArtifactVersion, envelope: Envelope) -> None:
        from kaizen_server_extension.store.artifacts.content import validate_envelope

        previous = validate_envelope(bytes(latest.content))
        if previous.binding != envelope.binding:
            raise ValidationFailed("A governed update cannot change its provenance or "
                                   "security markings.")

    async def _append_version(self, tx: Tx, root: m.Artifact, version: int, *, title: str,
                              kind: str, language: str | None, content: bytes,
                              mime: str | None, author: str, where: WriteContext,
                              room: str | None,
                              attestation: str | None) -> ArtifactVersionRecord:
        row = m.ArtifactVersion(
            id=new_id(), artifact_id=root.id, version=version, kind=kind, language=language,
            title=title, mime=mime or TEXT_MIME.get(kind, "application/octet-stream"),
            content=content, digest=content_digest(content), size=len(content), author=author,
            conversation_id=where.conversation_id, room_id=room, run_id=where.run_id,
            attestation=attestation, created_at=utcnow())
        tx.session.add(row)
        await tx.session.flush()
        record = _record(root, row)
        if where.conversation_id is not None:
            await tx.append_event(where.conversation_id, ARTIFACT_VERSION_EVENT, author,
                                  record.event_data(), run_id=where.run_id)
        return record

    async def count_versions(self, artifact_id: str) -> int:
        """Trusted callers and tests: how many versions a root has."""
        async with self.store.transaction() as tx:
            return int((await tx.session.execute(
                select(func.count()).select_from(m.ArtifactVersion)
                .where(m.ArtifactVersion.artifact_id == artifact_id))).scalar_one())
