"""The member's documents: uploads with versions, an owner ACL, shares into rooms, and search.

Who may read a document is decided in the query, every time: its owner, and the participants
of a room it is shared into, for as long as the share row and their participation exist.
Deleting the document or its share is therefore the end of access for the next statement, not
after a cache expires. Anything another member may not read is the same 404 as a document that
never existed (never 403).

Search runs on the database's own full-text index over the chunks of each document's current
version (migration 0014): SQLite FTS5 ranked by ``bm25()``, PostgreSQL a GIN-indexed
``tsvector`` ranked by ``ts_rank_cd``. The corpus a search may reach is computed in the same
statement: the member's readable documents; in a shared room only the documents shared into
that room (what its whole audience may read); an agent's knowledge scope intersects it and can
never add to it (R-002).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Select,
    and_,
    column,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    table,
    text,
)
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.agents import UNSCOPED, KnowledgeScope
from kaizen_server_extension.document_text import (
    MAX_DOCUMENT_CHARS,
    chunks,
    extract,
    postgresql_query,
    query_terms,
    sqlite_match,
)
from kaizen_server_extension.protocol.errors import BadRequest, Conflict, NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.store import Store

#: How many hits one search returns at most, and how much of each passage.
MAX_HITS = 20
MAX_EXCERPT_CHARS = 700
_MISSING = "The document does not exist or is not available to you."


class DocumentNotFound(NotFound):
    default_code = "document_not_found"


@dataclass(frozen=True, slots=True)
class DocumentRecord:
    id: str
    owner: str
    title: str
    current_version: int
    filename: str
    media_type: str
    size: int
    sha256: str
    chunks: int
    created_at: datetime
    updated_at: datetime
    #: The Jupyter contents path it was added from (``add_from_path``), else None.
    source_path: str | None = None

    def public(self, viewer: str | None = None) -> dict[str, Any]:
        """The document as ``viewer`` sees it: where it came from in the owner's Jupyter
        tree is the owner's to know, not a room's."""
        return {"id": self.id, "owner": self.owner, "title": self.title,
                "version": self.current_version, "filename": self.filename,
                "media_type": self.media_type, "size": self.size, "sha256": self.sha256,
                "chunks": self.chunks, "created_at": self.created_at.isoformat(),
                "updated_at": self.updated_at.isoformat(),
                "source_path": self.source_path if viewer == self.owner else None}


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage and what a citation of it needs."""

    chunk_id: str
    document_id: str
    version: int
    title: str
    locator: str
    excerpt: str
    score: float

    def public(self) -> dict[str, Any]:
        return {"chunk_id": self.chunk_id, "document_id": self.document_id,
                "version": self.version, "title": self.title, "locator": self.locator,
                "excerpt": self.excerpt, "score": round(self.score, 6),
                "citation": f"[{self.title}, v{self.version}, {self.locator}]"
                            f"(kaizen:document/{self.document_id}/v{self.version}"
                            f"#chunk={self.chunk_id})"}


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: tuple[Hit, ...]
    #: How many documents the search could reach (0: nothing was searchable).
    searched: int


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    chunk_id: str
    document_id: str
    version: int
    ordinal: int
    locator: str
    body: str


class SourceOutcome(StrEnum):
    """What adding a Jupyter path did: a new document, its next version, or nothing (the
    bytes and name are those of its current version)."""

    CREATED = "created"
    NEW_VERSION = "new_version"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, slots=True)
class VersionFile:
    """The stored bytes of one exact version, for the run_code projection."""

    document_id: str
    version: int
    filename: str
    media_type: str
    sha256: str
    size: int
    content: bytes


class DocumentStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- writes -----------------------------------------------------------------------------

    async def upload(self, member: str, filename: str, content: bytes,
                     title: str | None = None) -> DocumentRecord:
        extracted = extract(filename, content)  # before any transaction: it may be slow
        async with self.store.transaction() as tx:
            now = utcnow()
            row = m.Document(id=new_id(), owner=member, title=title or filename,
                             current_version=1, created_at=now, updated_at=now)
            tx.session.add(row)
            await tx.session.flush()
            await self._add_version(tx, row.id, 1, member, filename, content, extracted)
            await tx.audit(member, "member.document.uploaded",
                           {"document_id": row.id, "version": 1, "size": len(content)})
            return await self._record(tx, row)

    async def add_version(self, member: str, document_id: str, filename: str,
                          content: bytes) -> DocumentRecord:
        """A new current version; owner only. Earlier versions stay, unsearched."""
        extracted = extract(filename, content)
        async with self.store.transaction() as tx:
            row = await self._owned(tx, document_id, member)
            version = row.current_version + 1
            await self._add_version(tx, row.id, version, member, filename, content, extracted)
            row.current_version, row.updated_at = version, utcnow()
            await tx.session.flush()
            await tx.audit(member, "member.document.versioned",
                           {"document_id": row.id, "version": version, "size": len(content)})
            return await self._record(tx, row)

    async def add_from_path(self, member: str, path: str, filename: str, content: bytes,
                            title: str | None = None) -> tuple[DocumentRecord, SourceOutcome]:
        """``content`` of the member's Jupyter file ``path`` as a document: the first add
        makes one (titled ``title`` or the file's name), a later add with other bytes its
        next version (the title kept), an add of unchanged bytes nothing. The source row's
        key serializes concurrent adds of one path (the loser of the insert looks again)."""
        extracted = extract(filename, content)
        digest = hashlib.sha256(content).hexdigest()
        for _attempt in range(3):
            try:
                async with self.store.transaction() as tx:
                    source = (await tx.session.execute(
                        select(m.DocumentSource)
                        .where(m.DocumentSource.owner == member, m.DocumentSource.path == path)
                        .with_for_update())).scalar_one_or_none()
                    now = utcnow()
                    if source is None:
                        row = m.Document(id=new_id(), owner=member, title=title or filename,
                                         current_version=1, created_at=now, updated_at=now)
                        tx.session.add(row)
                        await tx.session.flush()
                        tx.session.add(m.DocumentSource(owner=member, path=path,
                                                        document_id=row.id, updated_at=now))
                        await tx.session.flush()
                        await self._add_version(tx, row.id, 1, member, filename, content,
                                                extracted)
                        await tx.audit(member, "member.document.uploaded",
                                       {"document_id": row.id, "version": 1,
                                        "size": len(content), "source": "jupyter"})
                        return await self._record(tx, row), SourceOutcome.CREATED
                    row = await self._owned(tx, source.document_id, member)
                    current = await tx.session.get(m.DocumentVersion,
                                                   (row.id, row.current_version))
                    if current is not None and (current.sha256, current.filename) == (
                            digest, filename[:300]):
                        return await self._record(tx, row), SourceOutcome.UNCHANGED
                    version = row.current_version + 1
                    await self._add_version(tx, row.id, version, member, filename, content,
                                            extracted)
                    row.current_version, row.updated_at = version, now
                    source.updated_at = now
                    await tx.session.flush()
                    await tx.audit(member, "member.document.versioned",
                                   {"document_id": row.id, "version": version,
                                    "size": len(content), "source": "jupyter"})
                    return await self._record(tx, row), SourceOutcome.NEW_VERSION
            except IntegrityError:
                continue  # another add of the same path created the source first
        raise Conflict("The document could not be stored; nothing was saved. Try again.",
                       code="document_busy")

    async def delete(self, member: str, document_id: str) -> None:
        """Owner only; versions, chunks (and their index entries) and shares go with it."""
        async with self.store.transaction() as tx:
            row = await self._owned(tx, document_id, member)
            await tx.session.execute(delete(m.Document).where(m.Document.id == row.id))
            await tx.audit(member, "member.document.deleted", {"document_id": document_id})

    async def share(self, member: str, document_id: str, conversation_id: str) -> bool:
        """Share into a room the owner is a participant of; True when newly shared."""
        async with self.store.transaction() as tx:
            row = await self._owned(tx, document_id, member)
            if not await self._participates(tx, member, conversation_id):
                raise NotFound("The conversation does not exist or is not available to you.",
                               code="conversation_not_found")
            if await tx.session.get(m.DocumentShare, (row.id, conversation_id)) is not None:
                return False
            tx.session.add(m.DocumentShare(document_id=row.id,
                                           conversation_id=conversation_id,
                                           shared_by=member, shared_at=utcnow()))
            try:
                await tx.session.flush()
            except IntegrityError:  # shared concurrently by the same owner: the same answer
                return False
            await tx.audit(member, "member.document.shared",
                           {"document_id": row.id}, conversation_id=conversation_id)
            return True

    async def unshare(self, member: str, document_id: str, conversation_id: str) -> bool:
        """Owner only; True when a share was removed. Access through it ends at once."""
        async with self.store.transaction() as tx:
            row = await self._owned(tx, document_id, member)
            removed = (await tx.session.execute(
                delete(m.DocumentShare).where(m.DocumentShare.document_id == row.id,
                                              m.DocumentShare.conversation_id
                                              == conversation_id))
            ).rowcount  # type: ignore[attr-defined]
            if removed:
                await tx.audit(member, "member.document.unshared",
                               {"document_id": row.id}, conversation_id=conversation_id)
            return bool(removed)

    # -- reads ------------------------------------------------------------------------------

    async def list_for(self, member: str, limit: int = 100) -> list[DocumentRecord]:
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.Document).where(m.Document.id.in_(_readable(member)))
                .order_by(m.Document.updated_at.desc(), m.Document.id).limit(limit)
            )).scalars().all()
            return [await self._record(tx, row) for row in rows]

    async def get(self, member: str, document_id: str, *, room: str | None = None,
                  scope: KnowledgeScope = UNSCOPED) -> DocumentRecord:
        async with self.store.transaction() as tx:
            return await self._record(tx, await self._readable(tx, member, document_id,
                                                               room, scope))

    async def versions(self, member: str, document_id: str) -> list[dict[str, Any]]:
        async with self.store.transaction() as tx:
            row = await self._readable(tx, member, document_id, None, UNSCOPED)
            found = (await tx.session.execute(
                select(m.DocumentVersion.version, m.DocumentVersion.filename,
                       m.DocumentVersion.size, m.DocumentVersion.sha256,
                       m.DocumentVersion.created_at)
                .where(m.DocumentVersion.document_id == row.id)
                .order_by(m.DocumentVersion.version))).all()
            return [{"version": v, "filename": f, "size": s, "sha256": d,
                     "created_at": c.isoformat()} for v, f, s, d, c in found]

    async def shares(self, member: str, document_id: str) -> list[str]:
        """The rooms the owner shared the document into (owner only)."""
        async with self.store.transaction() as tx:
            row = await self._owned(tx, document_id, member)
            return list((await tx.session.execute(
                select(m.DocumentShare.conversation_id)
                .where(m.DocumentShare.document_id == row.id)
                .order_by(m.DocumentShare.shared_at, m.DocumentShare.conversation_id)
            )).scalars().all())

    async def text_of(self, member: str, document_id: str, version: int | None = None
                      ) -> tuple[DocumentRecord, int, str]:
        """(document, version, extracted text) of a version the member may read."""
        async with self.store.transaction() as tx:
            row = await self._readable(tx, member, document_id, None, UNSCOPED)
            wanted = version or row.current_version
            body = (await tx.session.execute(
                select(m.DocumentVersion.text).where(
                    m.DocumentVersion.document_id == row.id,
                    m.DocumentVersion.version == wanted))).scalar_one_or_none()
            if body is None:
                raise DocumentNotFound("That version of the document does not exist.",
                                       code="version_not_found")
            return await self._record(tx, row), wanted, body

    async def passages(self, member: str, document_id: str, *, room: str | None,
                       scope: KnowledgeScope = UNSCOPED, start: int = 0,
                       max_chars: int = 8_000) -> tuple[DocumentRecord, list[ChunkRecord]]:
        """The current version's chunks from ordinal ``start``, at most ``max_chars`` of
        text, of a document the caller may reach in ``room`` under ``scope``."""
        async with self.store.transaction() as tx:
            row = await self._readable(tx, member, document_id, room, scope)
            found = (await tx.session.execute(
                select(m.DocumentChunk).where(
                    m.DocumentChunk.document_id == row.id,
                    m.DocumentChunk.version == row.current_version,
                    m.DocumentChunk.ordinal >= start)
                .order_by(m.DocumentChunk.ordinal).limit(64))).scalars().all()
            out: list[ChunkRecord] = []
            used = 0
            for chunk in found:
                if out and used + len(chunk.body) > max_chars:
                    break
                used += len(chunk.body)
                out.append(_chunk(chunk))
            return await self._record(tx, row), out

    async def version_passages(self, member: str, document_id: str, version: int
                               ) -> tuple[DocumentRecord, list[ChunkRecord]]:
        """Every passage of one exact version of a document the member may read, in order:
        what a citation link opens (its ``chunk_id`` among them)."""
        async with self.store.transaction() as tx:
            row = await self._readable(tx, member, document_id, None, UNSCOPED)
            if await tx.session.get(m.DocumentVersion, (row.id, version)) is None:
                raise DocumentNotFound("That version of the document does not exist.",
                                       code="version_not_found")
            found = (await tx.session.execute(
                select(m.DocumentChunk).where(m.DocumentChunk.document_id == row.id,
                                              m.DocumentChunk.version == version)
                .order_by(m.DocumentChunk.ordinal))).scalars().all()
            return await self._record(tx, row), [_chunk(c) for c in found]

    async def resolve_chunk(self, member: str, chunk_id: str, *, room: str | None,
                            scope: KnowledgeScope = UNSCOPED) -> ChunkRecord:
        """The chunk ``chunk_id`` if its parent document is readable now, in ``room``, under
        ``scope``, and it belongs to the parent's current version; else 404."""
        async with self.store.transaction() as tx:
            found = (await tx.session.execute(
                select(m.DocumentChunk).where(m.DocumentChunk.chunk_id == chunk_id[:64])
            )).scalar_one_or_none()
            if found is None:
                raise DocumentNotFound("That passage does not exist or is not available to "
                                       "you.", code="chunk_not_found")
            row = await self._readable(tx, member, found.document_id, room, scope)
            if row.current_version != found.version:
                raise DocumentNotFound("That passage is from an earlier version of its "
                                       "document; search again.", code="chunk_not_found")
            return _chunk(found)

    async def version_file(self, member: str, document_id: str, version: int, *,
                           room: str | None, scope: KnowledgeScope = UNSCOPED) -> VersionFile:
        """The bytes of ``version`` of a document the caller may reach now; 404 else."""
        async with self.store.transaction() as tx:
            row = await self._readable(tx, member, document_id, room, scope)
            found = await tx.session.get(m.DocumentVersion, (row.id, version))
            if found is None:
                raise DocumentNotFound("That version of the document does not exist.",
                                       code="version_not_found")
            return VersionFile(row.id, found.version, found.filename, found.media_type,
                               found.sha256, int(found.size), found.content)

    async def search(self, member: str, query: str, *, room: str | None = None,
                     scope: KnowledgeScope = UNSCOPED,
                     documents: Sequence[str] | None = None,
                     limit: int = 8) -> SearchResult:
        """Ranked passages of the current versions of the documents the caller may reach.

        ``documents`` names a subset; one the caller cannot reach fails the whole search
        (it is never dropped, and the search never widens past it, R-373)."""
        terms = query_terms(query)
        if not terms:
            raise BadRequest("The query holds no words to search for.", code="empty_query")
        limit = max(1, min(limit, MAX_HITS))
        async with self.store.transaction() as tx:
            corpus = _corpus(member, await self._room_shared(tx, member, room), room, scope)
            if documents is not None:
                wanted = sorted(set(documents))
                reachable = set((await tx.session.execute(
                    select(m.Document.id).where(m.Document.id.in_(wanted),
                                                m.Document.id.in_(corpus)))).scalars().all())
                if missing := [d for d in wanted if d not in reachable]:
                    raise DocumentNotFound(
                        f"{len(missing)} of the named documents do not exist or are not "
                        "available here; nothing was searched.",
                        code="document_not_found")
                corpus = select(m.Document.id).where(m.Document.id.in_(wanted))
            searched = (await tx.session.execute(
                select(func.count()).select_from(corpus.subquery()))).scalar_one()
            if not searched:
                return SearchResult((), 0)
            rows = (await tx.session.execute(
                _ranked(tx, terms, corpus, limit))).all()
            return SearchResult(tuple(
                Hit(chunk_id, document_id, version, title, locator,
                    body[:MAX_EXCERPT_CHARS], float(score))
                for chunk_id, document_id, version, title, locator, body, score in rows),
                int(searched))

    # -- internals --------------------------------------------------------------------------

    async def _add_version(self, tx: Tx, document_id: str, version: int, member: str,
                           filename: str, content: bytes, extracted: Any) -> None:
        tx.session.add(m.DocumentVersion(
            document_id=document_id, version=version, filename=filename[:300],
            media_type=extracted.media_type, size=len(content),
            sha256=hashlib.sha256(content).hexdigest(), content=content,
            text=extracted.text[:MAX_DOCUMENT_CHARS], author=member, created_at=utcnow()))
        await tx.session.flush()
        passages = chunks(extracted.segments)
        if passages:
            await tx.session.execute(insert(m.DocumentChunk), [
                {"chunk_id": new_id(), "document_id": document_id, "version": version,
                 "ordinal": c.ordinal, "locator": c.locator[:200], "body": c.body}
                for c in passages])

    async def _record(self, tx: Tx, row: m.Document) -> DocumentRecord:
        version = await tx.session.get(m.DocumentVersion, (row.id, row.current_version))
        assert version is not None
        count = (await tx.session.execute(
            select(func.count()).select_from(m.DocumentChunk).where(
                m.DocumentChunk.document_id == row.id,
                m.DocumentChunk.version == row.current_version))).scalar_one()
        source = (await tx.session.execute(
            select(m.DocumentSource.path).where(m.DocumentSource.document_id == row.id)
        )).scalar_one_or_none()
        return DocumentRecord(row.id, row.owner, row.title, row.current_version,
                              version.filename, version.media_type, version.size,
                              version.sha256, int(count), row.created_at, row.updated_at,
                              source)

    async def _owned(self, tx: Tx, document_id: str, member: str) -> m.Document:
        row = await tx.session.get(m.Document, document_id) if len(document_id) <= 64 else None
        if row is None or row.owner != member:
            raise DocumentNotFound(_MISSING)
        return row

    async def _readable(self, tx: Tx, member: str, document_id: str, room: str | None,
                        scope: KnowledgeScope) -> m.Document:
        corpus = _corpus(member, await self._room_shared(tx, member, room), room, scope)
        row = (await tx.session.execute(
            select(m.Document).where(m.Document.id == document_id[:64],
                                     m.Document.id.in_(corpus)))).scalar_one_or_none()
        if row is None:
            raise DocumentNotFound(_MISSING)
        return row

    @staticmethod
    async def _participates(tx: Tx, member: str, conversation_id: str) -> bool:
        return await tx.session.get(m.Participant, (conversation_id[:64], member)) is not None

    async def _room_shared(self, tx: Tx, member: str, room: str | None) -> bool:
        """Whether ``room`` is a shared room the member is in; a room they are not in (or
        none) is treated as shared, so it reaches only what was shared into it: nothing."""
        if room is None:
            return False
        if not await self._participates(tx, member, room):
            return True
        shared = (await tx.session.execute(
            select(m.Conversation.shared).where(m.Conversation.id == room))).scalar_one()
        return bool(shared)


def _readable(member: str) -> Select[Any]:
    """Ids of the documents ``member`` may read: their own, and those shared into a room
    they are a participant of."""
    shared_to_me = (select(m.DocumentShare.document_id)
                    .join(m.Participant,
                          m.Participant.conversation_id == m.DocumentShare.conversation_id)
                    .where(m.Participant.member_id == member))
    return select(m.Document.id).where(or_(m.Document.owner == member,
                                           m.Document.id.in_(shared_to_me)))


def _corpus(member: str, shared_room: bool, room: str | None,
            scope: KnowledgeScope) -> Select[Any]:
    """What a search or read may reach: the member's readable documents, or, in a shared
    room, only the readable documents shared into that room; narrowed by ``scope``."""
    query = _readable(member)
    if shared_room:
        query = query.where(m.Document.id.in_(
            select(m.DocumentShare.document_id).where(
                m.DocumentShare.conversation_id == (room or ""))))
    if scope.narrows:
        query = query.where(m.Document.id.in_(sorted(scope.documents)))
    return query


def _ranked(tx: Tx, terms: list[str], corpus: Select[Any], limit: int) -> Any:
    chunk, doc = m.DocumentChunk, m.Document
    current = and_(doc.id == chunk.document_id, doc.current_version == chunk.version,
                   doc.id.in_(corpus))
    if tx.session.get_bind().dialect.name == "sqlite":
        # The FTS5 table (migration 0014): its rowid is the chunk's integer id; the table's
        # own name is the column MATCH and bm25() take. bm25 is lower-is-better.
        fts = table("document_chunks_fts", column("rowid"))
        whole: Any = literal_column("document_chunks_fts")
        score = func.bm25(whole)
        return (select(chunk.chunk_id, chunk.document_id, chunk.version, doc.title,
                       chunk.locator, chunk.body, (-score).label("score"))
                .select_from(fts)
                .join(chunk, fts.c.rowid == chunk.id)
                .join(doc, current)
                .where(whole.op("MATCH")(sqlite_match(terms)))
                .order_by(score, chunk.id).limit(limit))
    vector: Any = literal_column("document_chunks.search_vector")
    tsquery = func.websearch_to_tsquery(text("'english'::regconfig"),
                                        postgresql_query(terms))
    rank = func.ts_rank_cd(vector, tsquery)
    return (select(chunk.chunk_id, chunk.document_id, chunk.version, doc.title, chunk.locator,
                   chunk.body, rank.label("score"))
            .join(doc, current)
            .where(vector.op("@@")(tsquery))
            .order_by(rank.desc(), chunk.id).limit(limit))


def _chunk(row: m.DocumentChunk) -> ChunkRecord:
    return ChunkRecord(row.chunk_id, row.document_id, row.version, row.ordinal, row.locator,
                       row.body)
