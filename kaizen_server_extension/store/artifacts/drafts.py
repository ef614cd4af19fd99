"""Staged artifact creation: one owner-only draft per ``begin``, advanced by fenced appends.

A draft is bound to its owner, its turn (run) and that run's execution fence. Each append names
the cursor it extends — sequence and running digest — and returns a receipt. Replaying the very
same append converges on the same receipt; a different chunk, a stale sequence or digest,
another member, another turn or an old fence fails closed and writes nothing (R-247..R-249).
``finalize`` verifies the exact cursor and materializes one ordinary version through the
artifact store, so every content validator and the attestation CHECK apply to it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.content import MAX_TEXT_BYTES, ValidationFailed
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    WriteContext,
)
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.store import Store

EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
_NOT_FOUND = "No such draft."
# A draft is the staged generation's checkpoint: what earlier appends saved is kept when a
# later call is fenced out, so these refusals never say "nothing was saved".
_KEPT = "What the draft saved before is kept as its checkpoint."
#: Refusals of a fenced staged generation: reported without a "nothing was saved" claim.
FENCED_DRAFT_CODES = frozenset({"draft_other_turn", "draft_fenced"})


def _sha(data: str) -> str:
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def next_digest(previous: str, chunk: str) -> str:
    """The running digest after appending ``chunk`` to a draft whose digest is ``previous``."""
    return _sha(f"{previous}:{_sha(chunk)}")


@dataclass(frozen=True, slots=True)
class DraftScope:
    """Who writes and under which execution: from the run's authority bundle."""

    owner: str
    conversation_id: str
    run_id: str
    fence: int


@dataclass(frozen=True, slots=True)
class DraftCursor:
    draft_id: str
    sequence: int
    digest: str
    status: str
    size: int
    receipt: str | None = None
    replayed: bool = False

    def public(self) -> dict[str, Any]:
        body: dict[str, Any] = {"draft_id": self.draft_id, "sequence": self.sequence,
                                "digest": self.digest, "status": self.status,
                                "size": self.size}
        if self.receipt is not None:
            body["receipt"] = self.receipt
        if self.replayed:
            body["replayed"] = True
        return body


def _cursor(draft: m.ArtifactDraft, *, replayed: bool = False) -> DraftCursor:
    return DraftCursor(draft.id, draft.sequence, draft.digest, draft.status,
                       len(draft.content.encode("utf-8")), draft.last_receipt, replayed)


class DraftStore:
    def __init__(self, store: Store, artifacts: ArtifactStore | None = None) -> None:
        self.store = store
        self.artifacts = artifacts or ArtifactStore(store)

    async def begin(self, scope: DraftScope, *, title: str, kind: str,
                    language: str | None) -> DraftCursor:
        async with self.store.transaction() as tx:
            await self._live(tx, scope)
            await self.store.conversations.get_for(scope.conversation_id, scope.owner, tx)
            now = utcnow()
            draft = m.ArtifactDraft(
                id=new_id(), owner=scope.owner, conversation_id=scope.conversation_id,
                run_id=scope.run_id, fence=scope.fence, title=title, kind=kind,
                language=language, content="", sequence=0, digest=EMPTY_DIGEST,
                status="open", created_at=now, updated_at=now)
            tx.session.add(draft)
            await tx.session.flush()
            return _cursor(draft)

    async def append(self, scope: DraftScope, draft_id: str, *, sequence: int, digest: str,
                     chunk: str) -> DraftCursor:
        async with self.store.transaction() as tx:
            draft = await self._open(tx, scope, draft_id)
            chunk_digest = _sha(chunk)
            if (sequence + 1 == draft.sequence and draft.last_chunk_digest == chunk_digest
                    and next_digest(digest, chunk) == draft.digest):
                return _cursor(draft, replayed=True)  # the same append again: converge
            self._at_cursor(draft, sequence, digest)
            content = draft.content + chunk
            if len(content.encode("utf-8")) > MAX_TEXT_BYTES:
                raise ValidationFailed(f"The draft would exceed {MAX_TEXT_BYTES} bytes; "
                                       "nothing was appended.", code="artifact_too_large")
            draft.content = content
            draft.sequence = sequence + 1
            draft.digest = next_digest(digest, chunk)
            draft.last_chunk_digest = chunk_digest
            draft.last_receipt = _sha(f"{draft.id}:{draft.sequence}:{draft.digest}")[:32]
            draft.updated_at = utcnow()
            await tx.session.flush()
            return _cursor(draft)

    async def finalize(self, scope: DraftScope, draft_id: str, *, sequence: int,
                       digest: str) -> ArtifactVersionRecord:
        async with self.store.transaction() as tx:
            draft = await self._owned(tx, scope, draft_id)
            if draft.status == "finalized" and draft.artifact_id is not None \
                    and (draft.sequence, draft.digest) == (sequence, digest):
                return await self.artifacts.resolve(scope.owner, draft.artifact_id, tx=tx)
            draft = await self._open(tx, scope, draft_id)
            self._at_cursor(draft, sequence, digest)
            if not draft.content:
                raise ValidationFailed("The draft is empty; append content before "
                                       "finalizing.", code="draft_empty")
            record = await self.artifacts.create(
                scope.owner, title=draft.title, kind=draft.kind, content=draft.content,
                language=draft.language,
                where=WriteContext(scope.conversation_id, scope.run_id), tx=tx)
            draft.status = "finalized"
            draft.artifact_id = record.artifact_id
            draft.updated_at = utcnow()
            await tx.session.flush()
            return record

    async def discard(self, scope: DraftScope, draft_id: str) -> DraftCursor:
        async with self.store.transaction() as tx:
            draft = await self._owned(tx, scope, draft_id)
            if draft.status == "discarded":
                return _cursor(draft, replayed=True)
            draft = await self._open(tx, scope, draft_id)
            draft.status = "discarded"
            draft.updated_at = utcnow()
            await tx.session.flush()
            return _cursor(draft)

    async def get(self, owner: str, draft_id: str) -> DraftCursor:
        async with self.store.transaction() as tx:
            draft = await tx.session.get(m.ArtifactDraft, draft_id)
            if draft is None or draft.owner != owner:
                raise NotFound(_NOT_FOUND, code="draft_not_found")
            return _cursor(draft)

    # --- fences ---------------------------------------------------------------------------

    async def _owned(self, tx: Tx, scope: DraftScope, draft_id: str) -> m.ArtifactDraft:
        draft = (await tx.session.execute(
            select(m.ArtifactDraft).where(m.ArtifactDraft.id == draft_id,
                                          m.ArtifactDraft.owner == scope.owner)
            .with_for_update())).scalar_one_or_none() if len(draft_id) <= 64 else None
        if draft is None:
            raise NotFound(_NOT_FOUND, code="draft_not_found")
        return draft

    async def _open(self, tx: Tx, scope: DraftScope, draft_id: str) -> m.ArtifactDraft:
        draft = await self._owned(tx, scope, draft_id)
        if draft.status != "open":
            raise Conflict(f"The draft is already {draft.status}; nothing was written.",
                           code="draft_closed")
        if draft.run_id != scope.run_id or draft.conversation_id != scope.conversation_id:
            raise Conflict(f"The draft belongs to another turn, so this call did not write to "
                           f"it. {_KEPT}", code="draft_other_turn")
        if draft.fence != scope.fence:
            raise Conflict(f"The draft's execution was taken over, so this call did not write "
                           f"to it. {_KEPT}", code="draft_fenced")
        await self._live(tx, scope)
        return draft

    @staticmethod
    async def _live(tx: Tx, scope: DraftScope) -> None:
        """The run must still hold this fence and be active: an expired execution cannot
        resume writing with its old fence (R-249)."""
        live = (await tx.session.execute(
            select(m.Run.id).where(m.Run.id == scope.run_id, m.Run.fence == scope.fence,
                                   m.Run.member == scope.owner,
                                   m.Run.conversation_id == scope.conversation_id,
                                   m.Run.status.in_(m.ACTIVE_RUN_STATUSES))
        )).scalar_one_or_none()
        if live is None:
            raise Conflict(f"This turn no longer holds the draft's execution (it was taken "
                           f"over or stopped), so this call did not write to it. {_KEPT}",
                           code="draft_fenced")

    @staticmethod
    def _at_cursor(draft: m.ArtifactDraft, sequence: int, digest: str) -> None:
        if (draft.sequence, draft.digest) != (sequence, digest):
            raise Conflict(
                f"Stale draft cursor: the draft is at sequence {draft.sequence} with digest "
                f"{draft.digest}; nothing was written.", code="stale_cursor")
