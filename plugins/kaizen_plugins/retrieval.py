"""search, query_document, conversation_history_search: retrieval with citations.

Every call re-decides what it may reach, in the store's own query, as the member of the run:
their readable documents (in a shared room only those shared into that room, so nothing of
theirs reaches an audience it was not given to), intersected with the agent's knowledge scope,
which narrows and never widens (R-002). What comes back is evidence: passages with the chunk id
and a citation the answer should carry, bounded in count and length.

request_document (private turns whose catalog also has search and run_code, R-180) takes only
a chunk id this turn's retrieval returned, re-resolves its parent document as the member now,
and adds that exact version to the run's read-only run_code projection (R-181).

A search that could reach no document at all is a failed call, not "no results" (R-372); a
named document the caller cannot reach fails the call rather than being dropped, so naming
documents never widens the search to the rest (R-373).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.resources import DOCUMENT_REFERENCE, MAX_ATTACHMENTS, SharedResource
from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    RoomClass,
    ToolContext,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar
from kaizen_server_extension.tools.services import ConversationHistory, DocumentLibrary

Query = Annotated[str, Field(min_length=1, max_length=500,
                             description="What to look for, in plain words.")]
DocumentId = Annotated[str, Field(min_length=1, max_length=64)]
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")
#: Admitted attachments and requested documents together, in one turn's projection.
MAX_PROJECTED = 2 * MAX_ATTACHMENTS
NO_SUPPORT = ("Nothing in the searched documents matches. Say that the documents do not "
              "answer this rather than guessing.")


def _documents(ctx: ToolContext) -> DocumentLibrary:
    documents = ctx.services.documents
    if documents is None:
        raise MemberSafeError("Documents are not available on this server.",
                              code="documents_unavailable")
    return documents


def _room(ctx: ToolContext) -> str | None:
    """The run's room; none for a call outside any run (Kaizen's own MCP endpoint), which
    reaches what the member may read, as their own REST search does."""
    return ctx.bundle.conversation_id or None


def _history(ctx: ToolContext) -> ConversationHistory:
    history = ctx.services.history
    if history is None:
        raise MemberSafeError("Conversation history is not available on this server.",
                              code="history_unavailable")
    return history


@tool(name="search", capability=Capability.READ, timeout_s=15,
      # Reaches exactly the room's shared documents in a shared room (store/documents.py).
      room_class=RoomClass.AUDIENCE_SAFE_READ, surface="documents")
async def search(ctx: ToolContext, query: Query,
                 document_ids: Annotated[list[DocumentId] | None, Field(
                     max_length=20, description="Search only these documents (ids from an "
                     "earlier search or the member).")] = None,
                 limit: Annotated[int, Field(ge=1, le=20)] = 8) -> dict[str, Any]:
    """Full-text search over the member's documents. Returns passages, each with a chunk_id and
    a citation; cite the passages you use, and say so when nothing supports an answer."""
    try:
        result = await _documents(ctx).search(
            ctx.member, query, room=_room(ctx), scope=ctx.services.knowledge_scope,
            documents=document_ids, limit=limit)
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None
    if not result.searched:
        raise MemberSafeError("No documents are available to search here, so nothing was "
                              "searched. The member can upload documents, or share them into "
                              "this conversation.", code="nothing_searchable")
    ctx.services.retrieved_chunks.update(h.chunk_id for h in result.hits)
    body: dict[str, Any] = {"query": query, "searched_documents": result.searched,
                            "hits": [h.public() for h in result.hits]}
    if not result.hits:
        body["note"] = NO_SUPPORT
    return body


@tool(name="query_document", capability=Capability.READ, timeout_s=15,
      room_class=RoomClass.AUDIENCE_SAFE_READ, surface="documents")
async def query_document(ctx: ToolContext, document_id: DocumentId,
                         query: Annotated[str | None, Field(
                             max_length=500, description="Find passages of this document "
                             "about this; omit to read it in order.")] = None,
                         start: Annotated[int, Field(
                             ge=0, le=100_000, description="Without a query: the first "
                             "passage to read (next_start of the previous read).")] = 0,
                         ) -> dict[str, Any]:
    """Read one document the member may read: its passages in order, or those matching a
    query. Each passage has a chunk_id and a citation."""
    documents = _documents(ctx)
    room, scope = _room(ctx), ctx.services.knowledge_scope
    try:
        if query:
            result = await documents.search(ctx.member, query, room=room, scope=scope,
                                            documents=[document_id], limit=8)
            ctx.services.retrieved_chunks.update(h.chunk_id for h in result.hits)
            return {"document_id": document_id,
                    "hits": [h.public() for h in result.hits],
                    **({} if result.hits else {"note": NO_SUPPORT})}
        record, passages = await documents.passages(ctx.member, document_id, room=room,
                                                    scope=scope, start=start)
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None
    ctx.services.retrieved_chunks.update(p.chunk_id for p in passages)
    cite = f"kaizen:document/{record.id}/v{record.current_version}"
    return {"document_id": record.id, "title": record.title,
            "version": record.current_version, "chunks": record.chunks,
            "passages": [{"chunk_id": p.chunk_id, "locator": p.locator, "text": p.body,
                          "citation": f"[{record.title}, v{record.current_version}, "
                                      f"{p.locator}]({cite}#chunk={p.chunk_id})"}
                         for p in passages],
            "next_start": (passages[-1].ordinal + 1
                           if passages and passages[-1].ordinal + 1 < record.chunks else None)}


@tool(name="conversation_history_search", capability=Capability.READ, timeout_s=15,
      # The member's own prior rooms: never into a room with anyone else in it.
      room_class=RoomClass.ACTOR_PRIVATE_READ, surface="history", private_room_only=True)
async def conversation_history_search(ctx: ToolContext, query: Query,
                                      limit: Annotated[int, Field(ge=1, le=10)] = 5,
                                      ) -> dict[str, Any]:
    """Find earlier conversations of the member about something: the matching message, the
    answer it got, and a citation of the conversation. This conversation is not searched."""
    try:
        hits = await _history(ctx).search(ctx.member, query, exclude=_room(ctx), limit=limit)
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None
    return {"query": query, "results": [h.public() for h in hits],
            **({} if hits else {"note": "No earlier conversation matches."})}


ChunkId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$",
                               description="A chunk_id that search or query_document returned "
                               "in this turn.")]
_NOT_RETRIEVED = ("request_document takes only a chunk_id that search or query_document "
                  "returned in this turn; a title, path or document id is not one. Search "
                  "first, then pass a chunk_id from the results.")


@tool(name="request_document", capability=Capability.READ, timeout_s=15,
      # A private file projected for the member's own code: never in a room with others.
      room_class=RoomClass.ACTOR_PRIVATE_READ, surface="documents",
      requires=("search", "run_code"), private_room_only=True)
async def request_document(ctx: ToolContext, chunk_id: ChunkId) -> dict[str, Any]:
    """Make the document a retrieved passage belongs to readable by run_code in this turn:
    its exact current version appears read-only in KAIZEN_SHARED_RESOURCES_DIR (listed in
    KAIZEN_SHARED_RESOURCES_MANIFEST) on the next run_code call."""
    if chunk_id not in ctx.services.retrieved_chunks:
        raise MemberSafeError(_NOT_RETRIEVED, code="chunk_not_retrieved")
    documents = _documents(ctx)
    room, scope = _room(ctx), ctx.services.knowledge_scope
    try:
        # Re-resolved now: the parent must still be readable here and this its current version.
        chunk = await documents.resolve_chunk(ctx.member, chunk_id, room=room, scope=scope)
        found = await documents.version_file(ctx.member, chunk.document_id, chunk.version,
                                             room=room, scope=scope)
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None
    requested = ctx.services.requested_documents
    taken = {r.filename for r in (*ctx.services.resources.resources, *requested)}
    existing = next((r for r in requested if r.reference_id == found.document_id), None)
    if existing is not None and existing.version == found.version:
        resource = existing
    else:
        if existing is not None:
            requested.remove(existing)
        resource = SharedResource(
            reference_id=found.document_id, kind=DOCUMENT_REFERENCE, version=found.version,
            sha256=found.sha256, filename=_flat_name(found.filename, taken),
            media_type=found.media_type, size=found.size)
        if len(ctx.services.resources.resources) + len(requested) >= MAX_PROJECTED:
            raise MemberSafeError(f"At most {MAX_PROJECTED} files can be projected in one "
                                  "turn.", code="too_many_documents")
        requested.append(resource)
    return {"document_id": resource.reference_id, "version": resource.version,
            "filename": resource.filename, "media_type": resource.media_type,
            "size": resource.size, "sha256": resource.sha256,
            "note": "Read it in run_code from KAIZEN_SHARED_RESOURCES_DIR (read-only)."}


def _flat_name(filename: str, taken: set[str]) -> str:
    """A safe, flat file name (no separators, no leading dot) not already in the projection."""
    name = _UNSAFE_NAME.sub("_", filename).strip(" ._")[:120] or "document"
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{n}-{name}"
    return candidate


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(search)
    register(query_document)
    register(conversation_history_search)
    register(request_document)
