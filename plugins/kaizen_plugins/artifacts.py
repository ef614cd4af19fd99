"""Artifact tools: single-call writes, anchored reads and edits, and the staged protocol.

Every tool acts as the member (``ctx.member``) through ``ctx.services.artifacts`` (the
versioned store); nothing here widens what the member could do on their own screen, and
``read_artifact`` is further kept to the agent's knowledge scope (R-002). Store
refusals (a version conflict, a foreign or missing root, a validator, the reserved pair) are
projected as definite "nothing was saved" errors (R-366); the turn goes on. A streamed
generation whose checkpoint or draft was fenced (taken over, stopped, interrupted, failed) is
the exception: its draft was saved when the checkpoint opened, so its refusal keeps the
store's own wording and never claims that nothing was saved (R-367).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Iterable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberError, NotFound
from kaizen_server_extension.protocol.tools import StoredFile
from kaizen_server_extension.resources import ARTIFACT_REFERENCE, AdmittedResources
from kaizen_server_extension.store.artifacts import (
    FENCED_CHECKPOINT_CODES,
    FENCED_DRAFT_CODES,
    MAX_WINDOW_LINES,
    MODEL_KINDS,
    ArtifactStore,
    ArtifactVersionRecord,
    CheckpointScope,
    DraftScope,
    DraftStore,
    EditError,
    WriteContext,
    apply_hunks,
    content_tag,
    is_reserved,
    numbered_window,
    parse_hunks,
    split_lines,
)
from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    ResourceContext,
    ResourceVerdict,
    RoomClass,
    ToolContext,
    WriteCategory,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar
from kaizen_server_extension.tools.services import ArtifactServices

T = TypeVar("T")

STAGED_PROTOCOL = "staged_artifact"
MAX_CONTENT_CHARS = 1_000_000
MAX_CHUNK_CHARS = 32_000
NATIVE_OFFICE_SUFFIXES = (".docx", ".pptx", ".xlsx")
#: The store's own answer for an id the member cannot open; an artifact outside the agent's
#: knowledge scope gets the same one, so the refusal does not tell the two apart.
ARTIFACT_NOT_FOUND = "No such artifact."

Kind = Literal["markdown", "html", "svg", "code", "mermaid", "react", "json", "graph"]
assert set(Kind.__args__) == set(MODEL_KINDS)  # type: ignore[attr-defined]
ArtifactId = Annotated[str, Field(min_length=1, max_length=64,
                                  description="The artifact's exact id, unchanged.")]
Title = Annotated[str, Field(min_length=1, max_length=300, description="A short title.")]
Language = Annotated[str | None, Field(
    max_length=64, description="For kind=code: the programming language (e.g. python).")]
Content = Annotated[str, Field(max_length=MAX_CONTENT_CHARS,
                               description="The complete content of the artifact.")]
DraftId = Annotated[str, Field(min_length=1, max_length=64)]
Sequence = Annotated[int, Field(ge=0, description="The draft cursor's sequence, as returned.")]
Digest = Annotated[str, Field(min_length=64, max_length=64,
                              description="The draft cursor's digest, as returned.")]

_WRITE = dict(capability=Capability.WRITE, room_class=RoomClass.ACTOR_BOUND_WRITE,
              write_category=WriteCategory.MEMBER_STORE, surface="artifacts", timeout_s=30)


def _services(ctx: ToolContext) -> ArtifactServices:
    services = ctx.services.artifacts
    if services is None:
        raise MemberSafeError("The artifact store is not available on this server.",
                              code="artifacts_unavailable")
    return services


def _artifacts(ctx: ToolContext) -> ArtifactStore:
    return _services(ctx).store


def _where(ctx: ToolContext) -> WriteContext:
    return WriteContext(ctx.bundle.conversation_id, ctx.bundle.run_id)


#: A fenced streamed generation's refusals: its draft was saved when its checkpoint opened.
FENCED_GENERATION_CODES = FENCED_CHECKPOINT_CODES | FENCED_DRAFT_CODES


async def _nothing_saved(call: Awaitable[T]) -> T:
    """A refusal the store raised before committing: a definite, member-safe error. A fenced
    streamed generation keeps the store's wording, which says where its draft is (R-367)."""
    try:
        return await call
    except MemberError as exc:
        message = exc.message
        if exc.code not in FENCED_GENERATION_CODES and "nothing was" not in message.lower():
            message += " Nothing was saved."
        raise MemberSafeError(message, code=exc.code) from None


def _refuse_title_and_pair(title: str | None, kind: str | None,
                           language: str | None) -> None:
    if title is not None and title.strip().lower().endswith(NATIVE_OFFICE_SUFFIXES):
        raise MemberSafeError(
            "create_artifact writes text and live-canvas formats only. A native Word, "
            "PowerPoint or Excel file (.docx, .pptx, .xlsx) must be produced with run_code, "
            "which builds the real file in the sandbox and saves it. Nothing was saved.",
            code="native_file_needs_run_code")
    if kind is not None and is_reserved(kind, language):
        raise MemberSafeError(
            "That kind and language are reserved for governed results from trusted tools and "
            "cannot be written directly. Nothing was saved.",
            code="reserved_artifact_language")


def _summary(record: ArtifactVersionRecord, verb: str) -> dict[str, Any]:
    text = record.text() if record.is_text else ""
    return {"artifact_id": record.artifact_id, "version": record.version,
            "title": record.title, "kind": record.kind, "language": record.language,
            "digest": record.digest, "size": record.size,
            "tag": content_tag(text) if record.is_text else None,
            "total_lines": len(split_lines(text)) if record.is_text else None,
            "summary": f"{verb} artifact {record.title!r} (version {record.version}). It is "
                       "shown in the Artifact pane; refer to it rather than repeating it."}


# --- resource authorization (the write guard's step; R-226) -----------------------------------
# Each runs just before its tool, against a read-only store, and answers the same
# member-safe sentence the tool body's own check would; the bodies keep their checks.


def _read_only_artifacts(ctx: ResourceContext) -> ArtifactStore:
    """The artifact store over the check's read-only transaction."""
    services = ctx.services.artifacts
    if services is None:
        raise MemberSafeError("The artifact store is not available on this server.",
                              code="artifacts_unavailable")
    return services.store


async def _resolvable(ctx: ResourceContext, artifact_id: str, *, room: str | None,
                      owned: bool) -> ResourceVerdict:
    try:
        record = await _read_only_artifacts(ctx).resolve(ctx.member, artifact_id, room=room)
    except MemberError as exc:
        return ResourceVerdict.deny(f"{exc.message} Nothing was saved.", exc.code)
    if owned and record.owner != ctx.member:
        # Another member's artifact looks exactly like a missing one (API.md: never 403).
        return ResourceVerdict.deny("No such artifact. Nothing was saved.",
                                    "artifact_not_found")
    return ResourceVerdict.allow()


async def _may_update(ctx: ResourceContext, arguments: Mapping[str, Any]) -> ResourceVerdict:
    """An explicit artifact_id must be the member's own artifact. Without one the body falls
    back to the focused artifact, which it resolves under the member itself."""
    target = arguments.get("artifact_id")
    if not target:
        return ResourceVerdict.allow()
    return await _resolvable(ctx, str(target), room=None, owned=True)


async def _may_edit(ctx: ResourceContext, arguments: Mapping[str, Any]) -> ResourceVerdict:
    """The member's own artifact, or one shared in this room (edited as a remix)."""
    return await _resolvable(ctx, str(arguments.get("artifact_id", "")),
                             room=ctx.bundle.conversation_id, owned=False)


# --- single-call writes ----------------------------------------------------------------------


@tool(name="create_artifact", repeat_creates_object=True,
      withheld_arguments=("content",), **_WRITE)  # type: ignore[arg-type]
async def create_artifact(ctx: ToolContext, title: Title, kind: Kind, content: Content,
                          language: Language = None) -> dict[str, Any]:
    """Create a new versioned artifact (markdown, html, svg, code, mermaid, react, json or a
    typed graph) in the member's library. Keep short answers in chat by default, but when the
    member explicitly asks you to create, make, build or write a report, document, page,
    diagram or other artifact, gather what you need and then create it even if it is short.
    Native Word, PowerPoint, Excel or PDF files are not artifacts: make them with run_code.
    A graph is JSON {nodes:[{id,label,type?}], edges:[{id,source,target,label?}],
    sources:[{id,title,url?}], references:[{target,source}]}."""
    _refuse_title_and_pair(title, kind, language)
    record = await _nothing_saved(_artifacts(ctx).create(
        ctx.member, title=title, kind=kind, content=content, language=language,
        where=_where(ctx)))
    return _summary(record, "Created")


@tool(name="update_artifact", authorize=_may_update,
      withheld_arguments=("content",), **_WRITE)  # type: ignore[arg-type]
async def update_artifact(ctx: ToolContext, content: Content,
                          artifact_id: ArtifactId | None = None, title: Title | None = None,
                          language: Language = None,
                          expected_version: Annotated[int | None, Field(
                              ge=1, description="The version you read; a newer one "
                                                "refuses the write.")] = None,
                          ) -> dict[str, Any]:
    """Replace the content of one of the member's artifacts with a new version. Pass the
    artifact_id exactly as given; without one, the artifact focused in the member's pane is
    used. Prefer edit_artifact for small changes to long artifacts."""
    # An explicit id is authoritative; the focused artifact is only a fallback.
    target = artifact_id or ctx.services.focused_artifact
    if not isinstance(target, str) or not target:
        raise MemberSafeError("Say which artifact to update: pass its artifact_id. Nothing "
                              "was saved.", code="artifact_id_required")
    _refuse_title_and_pair(title, None, None)
    store = _artifacts(ctx)
    current = await _nothing_saved(store.resolve(ctx.member, target)) \
        if language is not None else None
    if current is not None:
        _refuse_title_and_pair(None, current.kind, language)
    # The update completes through its private building row: a row an interrupted earlier
    # turn (or this call's own stream) opened is resumed and frozen into exactly this one
    # version; without one, a row is opened and frozen in the same transaction.
    checkpoints = _services(ctx).checkpoints
    scope = CheckpointScope(ctx.member, ctx.bundle.conversation_id, ctx.bundle.run_id,
                            f"completion:{uuid.uuid4().hex}")
    record, checkpoint = await _nothing_saved(checkpoints.freeze(
        scope, target, content=content, expected_version=expected_version, title=title,
        language=language))
    result = _summary(record, "Updated")
    if checkpoint.resumed:
        result["resumed_checkpoint"] = checkpoint.checkpoint_id
    return result


# --- anchored read and edit ------------------------------------------------------------------


async def _retrievable(ctx: ToolContext, artifact_id: str) -> ArtifactVersionRecord:
    """The latest version the member may see here, kept to the agent's knowledge scope: an
    artifact outside it answers exactly as one that does not exist (R-002, R-147)."""
    store = _artifacts(ctx)
    room = ctx.bundle.conversation_id
    record = await store.resolve(ctx.member, artifact_id, room=room)
    admitted = ctx.services.resources
    attached = {r.reference_id for r in admitted.resources if r.kind == ARTIFACT_REFERENCE} \
        if isinstance(admitted, AdmittedResources) else set()
    library = _services(ctx).library
    if not await library.may_retrieve(ctx.member, ctx.services.knowledge_scope, record,
                                      room=room, attached=attached):
        raise NotFound(ARTIFACT_NOT_FOUND, code="artifact_not_found")
    return record


@tool(name="read_artifact", capability=Capability.READ, room_class=RoomClass.ACTOR_BOUND_READ,
      surface="artifacts", timeout_s=15)
async def read_artifact(ctx: ToolContext, artifact_id: ArtifactId,
                        start_line: Annotated[int, Field(ge=1)] = 1,
                        line_count: Annotated[int, Field(ge=1, le=MAX_WINDOW_LINES)] =
                        MAX_WINDOW_LINES) -> dict[str, Any]:
    """Read up to 400 numbered lines of the latest version of an artifact you own or one
    shared in this conversation. Returns the version, total line count, content digest and
    the tag edit_artifact needs, under an [artifact#TAG] header."""
    record = await _nothing_saved(_retrievable(ctx, artifact_id))
    if not record.is_text:
        raise MemberSafeError("That artifact is a native file, not text; it can be "
                              "downloaded from the Artifact pane but not read here.",
                              code="artifact_not_text")
    text = record.text()
    tag = content_tag(text)
    try:
        rows, total, end = numbered_window(text, start_line, line_count)
    except EditError as exc:
        raise MemberSafeError(str(exc), code="invalid_window") from None
    return {"artifact_id": record.artifact_id, "version": record.version,
            "title": record.title, "kind": record.kind, "language": record.language,
            "total_lines": total, "digest": record.digest, "tag": tag,
            "start_line": start_line if total else 0, "end_line": end,
            "more": end < total, "text": f"[artifact#{tag}]\n{rows}"}


@tool(name="edit_artifact", authorize=_may_edit,
      withheld_arguments=("edits",), **_WRITE)  # type: ignore[arg-type]
async def edit_artifact(ctx: ToolContext, artifact_id: ArtifactId,
                        version: Annotated[int, Field(ge=1, description="The version read.")],
                        tag: Annotated[str, Field(pattern=r"^[0-9A-Fa-f]{4}$",
                                                  description="The tag read_artifact gave.")],
                        edits: Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS)],
                        ) -> dict[str, Any]:
    """Apply up to 32 non-overlapping hunks to the exact version you read, as one new version.
    Line numbers refer to that displayed version and never shift between hunks.
    `PUT A.=B:` then rows each starting with `+` replaces lines A..B (inclusive);
    `CUT A.=B` deletes them. Example:
    PUT 3.=4:
    +new line three
    CUT 9.=9"""
    store = _artifacts(ctx)
    source = await _nothing_saved(store.resolve(ctx.member, artifact_id,
                                                room=ctx.bundle.conversation_id))
    if not source.is_text:
        raise MemberSafeError("A native file cannot be edited; nothing was saved.",
                              code="artifact_not_text")
    current_tag = content_tag(source.text())
    if source.version != version or tag.upper() != current_tag:
        raise MemberSafeError(
            f"The edit targets version {version} #{tag.upper()}, but the latest version you "
            f"can see is {source.version} #{current_tag}. Nothing was saved: read the "
            "artifact again and reapply the change.", code="stale_version")
    try:
        hunks = parse_hunks(edits, expected_tag=current_tag)
        updated = apply_hunks(source.text(), hunks)
    except EditError as exc:
        raise MemberSafeError(f"{exc} Nothing was saved.", code="invalid_edit") from None
    if source.owner == ctx.member:
        record = await _nothing_saved(store.update(
            ctx.member, artifact_id, content=updated, expected_version=version,
            where=_where(ctx)))
        return _summary(record, "Edited") | {"hunks": len(hunks)}
    # A room-authorized foreign version: one actor-owned remix; the creator's root is
    # untouched.
    record = await _nothing_saved(store.create(
        ctx.member, title=source.title, kind=source.kind, content=updated,
        language=source.language, where=_where(ctx),
        derived_from=(source.artifact_id, source.version)))
    return _summary(record, "Remixed") | {"hunks": len(hunks),
                                          "remixed_from": source.artifact_id}



# --- the staged protocol ---------------------------------------------------------------------


def _drafts(ctx: ToolContext) -> tuple[DraftStore, DraftScope]:
    bundle = ctx.bundle
    return (_services(ctx).drafts,
            DraftScope(bundle.member, bundle.conversation_id, bundle.run_id, bundle.fence))


_STAGED = dict(_WRITE, protocol_group=STAGED_PROTOCOL)


@tool(name="begin_artifact", **_STAGED)  # type: ignore[arg-type]
async def begin_artifact(ctx: ToolContext, title: Title, kind: Kind,
                         language: Language = None) -> dict[str, Any]:
    """Open a draft for a substantial new artifact (a game, app, document, illustration...).
    Then send its content in order with append_artifact, passing back each returned
    sequence and digest, and finish with finalize_artifact (or discard_artifact).
    Native Word, PowerPoint, Excel or PDF files are not drafts: make them with run_code."""
    _refuse_title_and_pair(title, kind, language)
    drafts, scope = _drafts(ctx)
    cursor = await _nothing_saved(drafts.begin(scope, title=title, kind=kind,
                                               language=language))
    return cursor.public() | {"next": "append_artifact"}


@tool(name="append_artifact", withheld_arguments=("chunk",), **_STAGED)  # type: ignore[arg-type]
async def append_artifact(ctx: ToolContext, draft_id: DraftId, sequence: Sequence,
                          digest: Digest,
                          chunk: Annotated[str, Field(min_length=1,
                                                      max_length=MAX_CHUNK_CHARS)],
                          ) -> dict[str, Any]:
    """Append the next piece of a draft at the cursor (sequence, digest) you were given;
    returns the new cursor and a receipt."""
    drafts, scope = _drafts(ctx)
    cursor = await _nothing_saved(drafts.append(scope, draft_id, sequence=sequence,
                                                digest=digest, chunk=chunk))
    return cursor.public()


@tool(name="finalize_artifact", **_STAGED)  # type: ignore[arg-type]
async def finalize_artifact(ctx: ToolContext, draft_id: DraftId, sequence: Sequence,
                            digest: Digest) -> dict[str, Any]:
    """Finish a draft at its exact final cursor: it becomes version 1 of a new artifact."""
    drafts, scope = _drafts(ctx)
    record = await _nothing_saved(drafts.finalize(scope, draft_id, sequence=sequence,
                                                  digest=digest))
    return _summary(record, "Created") | {"draft_id": draft_id}


@tool(name="discard_artifact", **_STAGED)  # type: ignore[arg-type]
async def discard_artifact(ctx: ToolContext, draft_id: DraftId) -> dict[str, Any]:
    """Abandon a draft; nothing from it is kept as an artifact."""
    drafts, scope = _drafts(ctx)
    cursor = await _nothing_saved(drafts.discard(scope, draft_id))
    return cursor.public()


# --- run_code output files --------------------------------------------------------------------


async def persist_run_files(ctx: ToolContext, files: Iterable[Any],
                            payload: dict[str, Any], *, failed: bool) -> list[StoredFile]:
    """Store each file a run_code call produced as a version of the owner-scoped artifact
    keyed by (member, conversation, name), reusing the latest version when bytes and content
    type match (R-452). Files are kept even when the program failed. Each file is checked
    against its declared size and digest first (R-451); ``payload["files"]`` gains the
    artifact id and version each file is stored under. Returns the stored files, straight
    from the store's records, for the journal's generation placeholders (R-236)."""
    services = ctx.services.artifacts
    if services is None:
        return []
    store = services.store
    stored: list[StoredFile] = []
    described: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = list(payload.get("refused_files", []))
    for item in files:
        name, content = getattr(item, "name", None), getattr(item, "content", None)
        if not (isinstance(name, str) and 0 < len(name) <= 300 and isinstance(content, bytes)
                and not name.startswith(("/", "~")) and ".." not in name.split("/")
                and getattr(item, "size", None) == len(content)
                and getattr(item, "sha256", None) == hashlib.sha256(content).hexdigest()):
            refused.append({"name": str(name)[:300], "reason": "invalid"})
            continue
        mime = getattr(item, "mime", None)
        entry: dict[str, Any] = {"name": name, "size": len(content),
                                 "sha256": getattr(item, "sha256", ""), "mime": mime}
        try:
            record, reused = await store.persist_file(
                ctx.member, ctx.bundle.conversation_id, ctx.bundle.run_id, name, content,
                mime if isinstance(mime, str) else None)
        except MemberError as exc:
            entry |= {"saved": False, "reason": exc.code}
        else:
            entry |= {"saved": True, "artifact_id": record.artifact_id,
                      "version": record.version, "reused": reused}
            stored.append(StoredFile(target=name, artifact_id=record.artifact_id,
                                     version=record.version, filename=record.title,
                                     media_type=record.mime))
        described.append(entry)
    payload["files"] = described
    if refused:
        payload["refused_files"] = refused
    saved = [e["name"] for e in described if e.get("saved")]
    if failed and saved:
        payload["saved_files_note"] = (
            f"The program exited with an error, but it saved {', '.join(saved)}; the change "
            "may be incomplete. The member can already open these files.")
    return stored


TOOLS = (create_artifact, update_artifact, read_artifact, edit_artifact, begin_artifact,
         append_artifact, finalize_artifact, discard_artifact)


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    for registered in TOOLS:
        register(registered)
