"""Tables of the durable store. Invariants live in the schema, not only in Python.

Every table here is created by an Alembic migration (``store/migrations``); a test compares
these models with the migrated schema so the two cannot drift.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from kaizen_server_extension.protocol.tasks import MIN_TASK_INTERVAL_S

# Every text column and JSON document goes through the store's one policy for text the
# databases cannot store (store/storable.py): a text column refuses U+0000 and unpaired
# surrogates on both databases; a JSON document holding them is stored escaped and flagged.
from kaizen_server_extension.store.storable import StorableJSON
from kaizen_server_extension.store.storable import StorableString as String
from kaizen_server_extension.store.storable import StorableText as Text

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ACTIVE_RUN_STATUSES = ("running", "awaiting_approval")
TERMINAL_RUN_STATUSES = ("completed", "failed", "answer_unavailable", "cancelled")
RUN_STATUSES = ("queued", *ACTIVE_RUN_STATUSES, *TERMINAL_RUN_STATUSES)
APPROVAL_MODES = ("always_ask", "ask_for_writes", "never_ask")

# JSON on SQLite, JSONB on PostgreSQL.
JSONType = StorableJSON()


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both databases (SQLite stores no offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONType, list[Any]: JSONType, datetime: UTCDateTime()}


class Member(Base):
    __tablename__ = "members"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    display_name: Mapped[str] = mapped_column(String(200))
    approval_mode: Mapped[str] = mapped_column(String(20), server_default="ask_for_writes")
    model: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Opted in to compressing run_code output for the model (runtime/compression.py).
    tool_result_compression: Mapped[bool] = mapped_column(Boolean, default=False,
                                                          server_default=false())

    __table_args__ = (CheckConstraint(_in("approval_mode", APPROVAL_MODES), name="approval_mode"),)


class Agent(Base):
    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # NULL owner: a system agent visible to every member.
    owner: Mapped[str | None] = mapped_column(ForeignKey("members.id"))
    current_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (CheckConstraint("current_version >= 1", name="current_version"),)


class AgentVersion(Base):
    """Immutable: a change to an agent is a new row (a trigger refuses UPDATE)."""

    __tablename__ = "agent_versions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    persona: Mapped[str] = mapped_column(Text)
    tool_ceiling: Mapped[list[Any]] = mapped_column()
    knowledge_scope: Mapped[dict[str, Any]] = mapped_column()
    mode: Mapped[str] = mapped_column(String(10))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("agent_id", "version", name="uq_agent_versions_agent_version"),
        CheckConstraint("mode IN ('search', 'chat')", name="mode"),
        CheckConstraint("version >= 1", name="version"),
    )


class Conversation(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"))
    title: Mapped[str] = mapped_column(String(300))
    shared: Mapped[bool] = mapped_column(Boolean)
    audience_version: Mapped[int] = mapped_column(Integer, server_default="1")
    # Per-conversation counters bumped in the same transaction as the insert they number.
    last_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    last_position: Mapped[int] = mapped_column(BigInteger, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint("audience_version >= 1", name="audience_version"),
        CheckConstraint("last_seq >= 0", name="last_seq"),
        CheckConstraint("last_position >= 0", name="last_position"),
        Index("ix_conversations_owner", "owner"),
    )


class Participant(Base):
    __tablename__ = "participants"

    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    member_id: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    added_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_participants_member", "member_id"),)


class JournalEvent(Base):
    """Append-only; ``seq`` is unique and strictly increasing per conversation."""

    __tablename__ = "journal"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(BigInteger)
    run_id: Mapped[str | None] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    data: Mapped[dict[str, Any]] = mapped_column()

    __table_args__ = (
        UniqueConstraint("conversation_id", "seq", name="uq_journal_conversation_seq"),
        CheckConstraint("seq >= 1", name="seq"),
    )


class AcceptedInput(Base):
    __tablename__ = "accepted_inputs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    position: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    text: Mapped[str] = mapped_column(Text)
    text_digest: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    # The steering member's server-resolved model, fixed at acceptance.
    model: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("conversation_id", "position", name="uq_inputs_conversation_position"),
        UniqueConstraint("conversation_id", "idempotency_key", name="uq_inputs_idempotency"),
        CheckConstraint("kind IN ('message', 'steering')", name="kind"),
        CheckConstraint("position >= 1", name="position"),
    )


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    input_id: Mapped[str] = mapped_column(ForeignKey("accepted_inputs.id"), unique=True)
    # The authority bundle, fixed at admission.
    input_position: Mapped[int] = mapped_column(BigInteger)
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    agent_version_id: Mapped[str | None] = mapped_column(ForeignKey("agent_versions.id"))
    audience_version: Mapped[int | None] = mapped_column(Integer)
    resource_digest: Mapped[str | None] = mapped_column(String(64))
    catalog_digest: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(24), server_default="queued")
    reason: Mapped[str | None] = mapped_column(String(200))
    # Lease and fence: whoever recovers a stale run bumps the fence (DESIGN.md).
    fence: Mapped[int] = mapped_column(Integer, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    steps: Mapped[int] = mapped_column(Integer, server_default="0")
    tool_calls: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        # A terminal run has a settlement time and a non-terminal one has none.
        CheckConstraint(
            f"({_in('status', TERMINAL_RUN_STATUSES)}) = (settled_at IS NOT NULL)",
            name="settled",
        ),
        # At most one active run per room, enforced by the database.
        Index(
            "uq_runs_one_active_per_conversation",
            "conversation_id",
            unique=True,
            sqlite_where=text(_in("status", ACTIVE_RUN_STATUSES)),
            postgresql_where=text(_in("status", ACTIVE_RUN_STATUSES)),
        ),
        Index("ix_runs_conversation_status", "conversation_id", "status", "input_position"),
    )


class AuditEvent(Base):
    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[str | None] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column()

    __table_args__ = (Index("ix_audit_events_conversation", "conversation_id"),)


APPROVAL_STATUSES = ("pending", "approved", "denied", "consumed")


class Approval(Base):
    """A tool call waiting for the member's decision; decisions and receipts are one-shot."""

    __tablename__ = "approvals"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    tool: Mapped[str] = mapped_column(String(200))
    capability: Mapped[str] = mapped_column(String(20))
    args_digest: Mapped[str] = mapped_column(String(64))
    arguments: Mapped[dict[str, Any]] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), server_default="pending")
    decided_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(_in("status", APPROVAL_STATUSES), name="status"),
        CheckConstraint("(status = 'pending') = (decided_at IS NULL)", name="decided"),
        CheckConstraint("(status = 'consumed') = (consumed_at IS NOT NULL)", name="consumed"),
        Index("ix_approvals_member_status", "member", "status"),
        Index("ix_approvals_run_digest", "run_id", "args_digest"),
    )


class ToolPolicy(Base):
    """Admin policy: a tool denied for one member or (member ``*``) for everyone."""

    __tablename__ = "tool_policies"

    tool: Mapped[str] = mapped_column(String(200), primary_key=True)
    member: Mapped[str] = mapped_column(String(200), primary_key=True)
    allowed: Mapped[bool] = mapped_column(Boolean)
    updated_by: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class TokenUsage(Base):
    """Model tokens per member per UTC day (LLM_PER_USER_DAILY_TOKENS)."""

    __tablename__ = "token_usage"

    member: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)
    tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")

    __table_args__ = (CheckConstraint("tokens >= 0", name="tokens"),)


NOTIFICATION_KINDS = ("chat", "prompt", "task_run")
#: Suppressible destinations: an attended chat or foreground prompt stream (R-031).
FOREGROUND_NOTIFICATION_KINDS = ("chat", "prompt")
NOTIFICATION_ATTENDANCE = ("attended", "unattended", "unknown")


class Notification(Base):
    """A completion notice in a member's durable inbox (R-030..R-033).

    The destination is typed (``kind``) and names exact resource identities, never a URL.
    An attended chat or prompt stream is suppressed before insertion, so such a row cannot
    exist (the ``attended`` CHECK). One notice per member per source (``dedupe_key``), however
    many processes report the same settlement.
    """

    __tablename__ = "notifications"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    kind: Mapped[str] = mapped_column(String(16))
    # chat: the conversation; prompt: the saved prompt; task_run: the task.
    resource_id: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[str | None] = mapped_column(String(64))
    attendance: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(24))
    title: Mapped[str] = mapped_column(String(300))
    dedupe_key: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(_in("kind", NOTIFICATION_KINDS), name="kind"),
        CheckConstraint(_in("attendance", NOTIFICATION_ATTENDANCE), name="attendance_value"),
        CheckConstraint(
            f"NOT ({_in('kind', FOREGROUND_NOTIFICATION_KINDS)} AND attendance = 'attended')",
            name="attended",
        ),
        CheckConstraint("kind = 'prompt' OR run_id IS NOT NULL", name="run_id"),
        UniqueConstraint("member", "dedupe_key", name="uq_notifications_member_dedupe"),
        Index("ix_notifications_member_acked", "member", "acked_at", "created_at"),
    )


# --- Artifacts (issue 6) ---------------------------------------------------------------------

ARTIFACT_KINDS = ("markdown", "html", "svg", "code", "mermaid", "react", "json", "graph", "file")
DRAFT_STATUSES = ("open", "finalized", "discarded")
# The reserved renderable-artifact pair: only a server-attested version may carry it.
RESERVED_ARTIFACT_KIND = "code"
RESERVED_ARTIFACT_LANGUAGE = "renderable-artifact"
# Installed by migration 0006 (after the 0005 quarantine), validated by 0007.
ATTESTATION_CHECK = (
    f"NOT (kind = '{RESERVED_ARTIFACT_KIND}' AND language = '{RESERVED_ARTIFACT_LANGUAGE}') "
    "OR attestation IS NOT NULL"
)


class Artifact(Base):
    """An artifact root: identity, owner and the number of its latest immutable version."""

    __tablename__ = "artifacts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    title: Mapped[str] = mapped_column(String(300))
    kind: Mapped[str] = mapped_column(String(16))
    # The room the root was created in (provenance; never an authorization by itself).
    conversation_id: Mapped[str | None] = mapped_column(String(64))
    # run_code output files: one root per (owner, conversation, file name).
    source_name: Mapped[str | None] = mapped_column(String(300))
    # Lineage: the root and version this one was forked or remixed from.
    derived_from: Mapped[str | None] = mapped_column(String(64))
    derived_version: Mapped[int | None] = mapped_column(Integer)
    current_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint("current_version >= 1", name="current_version"),
        CheckConstraint(_in("kind", ARTIFACT_KINDS), name="kind"),
        UniqueConstraint("owner", "conversation_id", "source_name",
                         name="uq_artifacts_owner_source"),
        Index("ix_artifacts_owner", "owner", "updated_at"),
        # a member derives at most one root from one exact source version.
        Index("uq_artifacts_one_derivation", "owner", "derived_from", "derived_version",
              unique=True, sqlite_where=text("derived_from IS NOT NULL"),
              postgresql_where=text("derived_from IS NOT NULL")),
    )


class ArtifactVersion(Base):
    """Immutable: a change to an artifact is a new row (a trigger refuses UPDATE)."""

    __tablename__ = "artifact_versions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    artifact_id: Mapped[str] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    language: Mapped[str | None] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(String(300))
    mime: Mapped[str] = mapped_column(String(200))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    digest: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    author: Mapped[str] = mapped_column(String(200))
    conversation_id: Mapped[str | None] = mapped_column(String(64))
    # The shared room this exact version is bound to: its participants may read it.
    room_id: Mapped[str | None] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(64))
    # The server-attestation marker; required for the reserved pair (ATTESTATION_CHECK).
    attestation: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("artifact_id", "version", name="uq_artifact_versions_artifact_version"),
        CheckConstraint("version >= 1", name="version"),
        CheckConstraint("size >= 0", name="size"),
        CheckConstraint(ATTESTATION_CHECK, name="attestation"),
        Index("ix_artifact_versions_room", "room_id"),
    )


class ArtifactDraft(Base):
    """A staged, owner-only draft: a sequence and running digest advance with each append."""

    __tablename__ = "artifact_drafts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(String(64))
    fence: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(300))
    kind: Mapped[str] = mapped_column(String(16))
    language: Mapped[str | None] = mapped_column(String(64))
    content: Mapped[str] = mapped_column(Text)
    sequence: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    # The last append, so an exact replay converges on its receipt.
    last_receipt: Mapped[str | None] = mapped_column(String(64))
    last_chunk_digest: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    artifact_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(_in("status", DRAFT_STATUSES), name="status"),
        CheckConstraint("sequence >= 0", name="sequence"),
        Index("ix_artifact_drafts_owner", "owner", "status"),
    )


CHECKPOINT_STATUSES = ("building", "interrupted", "frozen")
OPEN_CHECKPOINT_STATUSES = ("building", "interrupted")


class ArtifactUpdateCheckpoint(Base):
    """The private building row of a streamed ``update_artifact`` (R-245, R-444, R-445).

    Opened before content streams, advanced by argument deltas, fenced by owner, run and call.
    An interrupted stream leaves it ``interrupted``; the next turn's retry takes the same row
    over (a new run, call and fence) and completion freezes it into exactly one new version.
    ``create_artifact`` never has one (R-109, R-111)."""

    __tablename__ = "artifact_update_checkpoints"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    artifact_id: Mapped[str] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"))
    # The version the update builds on; freezing appends base_version + 1.
    base_version: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str] = mapped_column(String(64))
    call_id: Mapped[str] = mapped_column(String(200))
    fence: Mapped[int] = mapped_column(Integer)
    # The raw argument text received so far (never parsed until the call completes).
    arguments: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    frozen_version: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(_in("status", CHECKPOINT_STATUSES), name="status"),
        CheckConstraint("(status = 'frozen') = (frozen_version IS NOT NULL)", name="frozen"),
        CheckConstraint("base_version >= 1", name="base_version"),
        CheckConstraint("fence >= 1", name="fence"),
        # One open building row per (owner, artifact): a retry resumes it, never a second.
        Index("uq_artifact_update_checkpoints_open", "owner", "artifact_id", unique=True,
              sqlite_where=text(_in("status", OPEN_CHECKPOINT_STATUSES)),
              postgresql_where=text(_in("status", OPEN_CHECKPOINT_STATUSES))),
    )



# --- Library: collections and projects (issue 6) ----------------------------------------------

PROJECT_ITEM_KINDS = ("artifact", "collection", "project")


class LibraryCollection(Base):
    __tablename__ = "library_collections"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_library_collections_owner", "owner"),)


class LibraryCollectionItem(Base):
    """Idempotent membership: filing the same artifact twice leaves one row."""

    __tablename__ = "library_collection_items"

    collection_id: Mapped[str] = mapped_column(
        ForeignKey("library_collections.id", ondelete="CASCADE"), primary_key=True)
    artifact_id: Mapped[str] = mapped_column(
        ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True)
    added_by: Mapped[str] = mapped_column(String(200))
    added_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LibraryProject(Base):
    __tablename__ = "library_projects"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_library_projects_owner", "owner"),)


class LibraryProjectItem(Base):
    """A non-owning pointer from a project to a library item."""

    __tablename__ = "library_project_items"

    project_id: Mapped[str] = mapped_column(
        ForeignKey("library_projects.id", ondelete="CASCADE"), primary_key=True)
    item_kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    item_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    added_by: Mapped[str] = mapped_column(String(200))
    added_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (CheckConstraint(_in("item_kind", PROJECT_ITEM_KINDS), name="item_kind"),)


# --- Turn attachments and Hashline workspace state (issue 5, migration 0009) ------------------

MAX_INPUT_ATTACHMENTS = 8
HASHLINE_MAX_VERSIONS = 4


class InputAttachment(Base):
    """One file a member attached to an accepted input, pinned to an exact completed version
    (R-449): the composite foreign key makes the pin point at a real immutable version row."""

    __tablename__ = "input_attachments"

    input_id: Mapped[str] = mapped_column(
        ForeignKey("accepted_inputs.id", ondelete="CASCADE"), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    filename: Mapped[str] = mapped_column(String(300))
    media_type: Mapped[str] = mapped_column(String(200))

    __table_args__ = (
        ForeignKeyConstraint(["artifact_id", "version"],
                             ["artifact_versions.artifact_id", "artifact_versions.version"],
                             name="fk_input_attachments_artifact_version"),
        UniqueConstraint("input_id", "artifact_id", name="uq_input_attachments_artifact"),
        CheckConstraint(f"ordinal >= 0 AND ordinal < {MAX_INPUT_ATTACHMENTS}", name="ordinal"),
        CheckConstraint("version >= 1", name="version"),
        CheckConstraint("size >= 0", name="size"),
        CheckConstraint("length(digest) = 64", name="digest"),
        CheckConstraint("length(filename) >= 1", name="filename"),
    )


class HashlineVersion(Base):
    """A retained full-text version of one workspace path (HASHLINE.md §2.1, R-159).

    ``slot`` 0 is the newest; the CHECK on it is what bounds the history to four versions per
    (actor, conversation, path) in the database itself."""

    __tablename__ = "hashline_versions"

    actor: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    tag: Mapped[str] = mapped_column(String(8))
    text: Mapped[str] = mapped_column(Text)
    # 1-based line numbers a read displayed (only those may be edited).
    seen: Mapped[list[Any]] = mapped_column()
    # The namespace's LRU order of paths: larger is more recent.
    touched: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        CheckConstraint(f"slot >= 0 AND slot < {HASHLINE_MAX_VERSIONS}", name="slot"),
    )


class HashlineRegister(Base):
    """A named Hashline register of one (actor, conversation), kept across calls."""

    __tablename__ = "hashline_registers"

    actor: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    rows: Mapped[list[Any]] = mapped_column()


# --- notebooks (kaizen_server_extension/notebooks, docs/notebook.md) ---------------------

NOTEBOOK_EDIT_OPS = ("insert", "replace", "delete")
NOTEBOOK_CELL_TYPES = ("code", "markdown", "raw")
NOTEBOOK_EDIT_DECISIONS = ("pending", "accepted", "rejected")
NOTEBOOK_EDIT_OUTCOMES = ("applied", "stale", "failed", "undone")
#: Cells one proposal may change.
MAX_NOTEBOOK_EDIT_CELLS = 16


class NotebookKernelAccess(Base):
    """A member's permission, for one conversation, to let inspect_notebook_kernel run its
    fixed probe in the kernels of notebooks they attach there. No row, no probe."""

    __tablename__ = "notebook_kernel_access"

    member: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime())


class NotebookEditProposal(Base):
    """A propose_notebook_edit call's proposal: made by a run for its member, against the
    exact pinned notebook version (the composite key onto artifact_versions) it read."""

    __tablename__ = "notebook_edit_proposals"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    artifact_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1024))
    base_fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        ForeignKeyConstraint(["artifact_id", "version"],
                             ["artifact_versions.artifact_id", "artifact_versions.version"],
                             name="fk_notebook_edit_proposals_artifact_version"),
        CheckConstraint("length(base_fingerprint) = 64", name="base_fingerprint"),
        CheckConstraint("length(path) >= 1", name="path"),
    )


class NotebookEditCell(Base):
    """One cell of a proposal, decided once and then applied, found stale, failed or undone
    in the member's browser. The database holds the lifecycle's shape: an outcome only for an
    accepted cell, run-after only for an inserted code cell, sources as the op needs them."""

    __tablename__ = "notebook_edit_cells"

    proposal_id: Mapped[str] = mapped_column(
        ForeignKey("notebook_edit_proposals.id", ondelete="CASCADE"), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String(8))
    cell_id: Mapped[str] = mapped_column(String(64))
    after_cell_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cell_type: Mapped[str] = mapped_column(String(8))
    base_source: Mapped[str | None] = mapped_column(Text, nullable=True)
    base_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    decision: Mapped[str] = mapped_column(String(8))
    run_after: Mapped[bool] = mapped_column(Boolean)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(8), nullable=True)
    outcome_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        UniqueConstraint("proposal_id", "cell_id", name="uq_notebook_edit_cells_cell"),
        CheckConstraint(f"ordinal >= 0 AND ordinal < {MAX_NOTEBOOK_EDIT_CELLS}",
                        name="ordinal"),
        CheckConstraint(_in("op", NOTEBOOK_EDIT_OPS), name="op"),
        CheckConstraint(_in("cell_type", NOTEBOOK_CELL_TYPES), name="cell_type"),
        CheckConstraint(_in("decision", NOTEBOOK_EDIT_DECISIONS), name="decision"),
        CheckConstraint(f"outcome IS NULL OR ({_in('outcome', NOTEBOOK_EDIT_OUTCOMES)} "
                        "AND decision = 'accepted')", name="outcome"),
        CheckConstraint("(op = 'delete') = (source IS NULL)", name="source"),
        CheckConstraint("(op = 'insert') = (base_digest IS NULL) AND "
                        "(base_digest IS NULL) = (base_source IS NULL)", name="base"),
        CheckConstraint("after_cell_id IS NULL OR op = 'insert'", name="anchor"),
        CheckConstraint("NOT run_after OR (op = 'insert' AND cell_type = 'code' AND "
                        "decision = 'accepted')", name="run_after"),
    )


# --- "Allow for this conversation" and the member's Jupyter files (issue 13, migration 0011) ---

#: The only capability a conversation grant may answer for: a sensitive or undeclared tool
#: confirms every call (R-152), and a read never asks.
GRANTABLE_CAPABILITY = "write"


class ConversationToolGrant(Base):
    """One member's standing answer to the approval gate for one tool in one conversation.

    It answers only the member's own approval mode, and only from the call's facts
    (``store/calls.py: open_call``); every guardrail, ceiling, permission and the write guard
    still run. The primary key makes it unique per (member, conversation, tool); revoking
    deletes the row (the audit log keeps both)."""

    __tablename__ = "conversation_tool_grants"

    member: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    tool: Mapped[str] = mapped_column(String(200), primary_key=True)
    capability: Mapped[str] = mapped_column(String(20))
    # The approval decision that made it (kept when that row goes).
    approval_id: Mapped[str | None] = mapped_column(
        ForeignKey("approvals.id", ondelete="SET NULL"))
    granted_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(f"capability = '{GRANTABLE_CAPABILITY}'", name="capability"),
    )


class ConversationToolChoice(Base):
    """One member's choice to leave a source tool out of their turns in one conversation:
    a source tool's exact name, a source (``mcp__<id>``, ``openapi__<id>``), a family
    (``mcp``, ``openapi``) or every source (``sources``). It only narrows what discovery,
    the agent's ceiling and admin policy already allow (R-311); it never grants."""

    __tablename__ = "conversation_tool_choices"

    member: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    tool: Mapped[str] = mapped_column(String(200), primary_key=True)
    chosen_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JupyterFileSource(Base):
    """Which artifact holds a member's copies of one file of the Jupyter contents tree: each
    read through the ContentsManager is a version of it (unchanged bytes reuse the latest)."""

    __tablename__ = "jupyter_file_sources"

    owner: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    # The ContentsManager's API path, relative to the server's root ("data/sales.csv").
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    artifact_id: Mapped[str] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("artifact_id", name="uq_jupyter_file_sources_artifact"),
        CheckConstraint("length(path) >= 1", name="path"),
    )


# --- durable tasks (issue 20, migration 0013) -------------------------------------------------

TASK_STATUSES = ("active", "paused")
#: How a firing came about: the cadence, the owner's "run now" or "safe test", or one
#: background attempt (``manage_tasks run_in_background``).
TASK_FIRING_KINDS = ("scheduled", "run_now", "safe_test", "background")
#: The server-owned posture a task's run carries (R-053); chat runs have none.
TASK_POSTURES = ("task_run", "task_test")


class Task(Base):
    """A member's saved prompt, fired into one of their rooms now, on a cadence, or both.

    ``next_due_at`` is the one scheduling fact: a firing moves it forward with a compare-and-
    set, and ``task_firings`` is unique per (task, key), so a due time fires once however
    many replicas see it due. A paused or cadence-less task has no due time."""

    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    interval_seconds: Mapped[int | None] = mapped_column(Integer)
    next_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    # Bumped by every edit: a stale edit (or a stale run's authority) is told apart.
    version: Mapped[int] = mapped_column(Integer)
    # Due times that passed while no server ran: coalesced into the next firing.
    missed_firings: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(_in("status", TASK_STATUSES), name="status"),
        CheckConstraint("length(name) >= 1", name="name"),
        CheckConstraint("length(prompt) >= 1", name="prompt"),
        CheckConstraint(f"interval_seconds IS NULL OR interval_seconds >= "
                        f"{MIN_TASK_INTERVAL_S}", name="interval"),
        # Only an active task with a cadence is ever due.
        CheckConstraint("next_due_at IS NULL OR (status = 'active' AND "
                        "interval_seconds IS NOT NULL)", name="due"),
        CheckConstraint("version >= 1 AND missed_firings >= 0", name="counters"),
        Index("ix_tasks_due", "status", "next_due_at"),
        Index("ix_tasks_owner", "owner"),
    )


class TaskFiring(Base):
    """One firing of a task: the accepted input it became (``run_id``), or why it could not.

    ``key`` is ``due:<time>`` for a scheduled firing and the caller's idempotency key (or a
    fresh id) otherwise; unique per task, so neither a second replica nor a retried request
    fires twice. A firing is written before its input is accepted and the input's idempotency
    key is the firing's id, so a crash between the two is finished by whoever sees the firing
    without a run, never duplicated (R-054)."""

    __tablename__ = "task_firings"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Kept (task_id NULL) when the task is deleted: a run still in flight keeps its posture
    # and finds no task authority, so it is blocked rather than become a chat run.
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"))
    key: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    posture: Mapped[str] = mapped_column(String(16))
    due_at: Mapped[datetime] = mapped_column(UTCDateTime())
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # A member-safe reason when the input could not be accepted (the room is gone, …).
    error: Mapped[str | None] = mapped_column(String(300))
    # The task version fired: the run's authority is re-checked against the live task.
    task_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("task_id", "key", name="uq_task_firings_task_key"),
        UniqueConstraint("run_id", name="uq_task_firings_run"),
        CheckConstraint(_in("kind", TASK_FIRING_KINDS), name="kind"),
        CheckConstraint(_in("posture", TASK_POSTURES), name="posture"),
        # A safe test, and only a safe test, runs in the test posture.
        CheckConstraint("(kind = 'safe_test') = (posture = 'task_test')", name="test_posture"),
        CheckConstraint("run_id IS NULL OR error IS NULL", name="outcome"),
        Index("ix_task_firings_task_created", "task_id", "created_at"),
    )


# Documents: the member's uploaded corpus for retrieval (docs/retrieval.md). Migration 0014
# adds what SQLAlchemy cannot declare on both databases: the full-text index over chunk
# bodies (an external-content SQLite FTS5 table kept by triggers; on PostgreSQL a generated
# ``search_vector`` tsvector column with a GIN index), and triggers refusing UPDATE of a
# version or chunk row. ``FULL_TEXT_OBJECTS`` names them so the model/schema comparison skips
# them knowingly.
FULL_TEXT_OBJECTS = frozenset({
    "document_chunks_fts", "document_chunks_fts_data", "document_chunks_fts_idx",
    "document_chunks_fts_docsize", "document_chunks_fts_config", "document_chunks_fts_content",
    "search_vector", "ix_document_chunks_search_vector"})


class Document(Base):
    """A document root: owner, title and the number of its latest immutable version."""

    __tablename__ = "documents"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    title: Mapped[str] = mapped_column(String(300))
    current_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint("current_version >= 1", name="current_version"),
        CheckConstraint("length(title) >= 1", name="title"),
        Index("ix_documents_owner", "owner", "updated_at"),
    )


class DocumentVersion(Base):
    """Immutable (a trigger refuses UPDATE): the uploaded bytes and the text extracted."""

    __tablename__ = "document_versions"

    document_id: Mapped[str] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    filename: Mapped[str] = mapped_column(String(300))
    media_type: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    text: Mapped[str] = mapped_column(Text)
    author: Mapped[str] = mapped_column(ForeignKey("members.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint("version >= 1", name="version"),
        CheckConstraint("size >= 0", name="size"),
    )


class DocumentChunk(Base):
    """One indexed passage of one exact version. ``chunk_id`` is the opaque id retrieval
    hands out; ``id`` is the integer row the full-text index points at."""

    __tablename__ = "document_chunks"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    chunk_id: Mapped[str] = mapped_column(String(64), unique=True)
    document_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    ordinal: Mapped[int] = mapped_column(Integer)
    # Where the passage is, for a citation: "lines 12-40", "cell 3", "page 2".
    locator: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        ForeignKeyConstraint(["document_id", "version"],
                             ["document_versions.document_id", "document_versions.version"],
                             name="fk_document_chunks_version", ondelete="CASCADE"),
        UniqueConstraint("document_id", "version", "ordinal",
                         name="uq_document_chunks_version_ordinal"),
        CheckConstraint("ordinal >= 0", name="ordinal"),
    )


class DocumentSource(Base):
    """The document whose versions are one file of the member's Jupyter contents tree, each
    as it was when they added it (migration 0016); gone with the document."""

    __tablename__ = "document_sources"

    owner: Mapped[str] = mapped_column(ForeignKey("members.id"), primary_key=True)
    # The ContentsManager's API path, relative to the server's root ("reports/q3.md").
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    document_id: Mapped[str] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("document_id", name="uq_document_sources_document"),
        CheckConstraint("length(path) >= 1", name="path"),
    )


class DocumentShare(Base):
    """The owner shared the document into a room: its participants may read and search it
    for as long as the row exists (deleting it removes access at once)."""

    __tablename__ = "document_shares"

    document_id: Mapped[str] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    shared_by: Mapped[str] = mapped_column(ForeignKey("members.id"))
    shared_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_document_shares_conversation", "conversation_id"),)


# --- credential quarantine (issue 19, migration 0018) ---------------------------------------

#: How a credential a member entered is kept: ``once`` in this process's memory for exactly
#: one brokered request, ``remember`` sealed here until the member deletes it.
CREDENTIAL_RETENTIONS = ("once", "remember")
#: What a receipt is the claim of: a form's nonce, or one brokered request.
CREDENTIAL_RECEIPT_KINDS = ("form", "request")
#: ``claimed`` before anything happens (the nonce is spent), then exactly one terminal.
CREDENTIAL_RECEIPT_STATUSES = ("claimed", "stored", "succeeded", "failed", "ambiguous")


class CredentialSecret(Base):
    """A credential a member chose to remember: sealed (AES-GCM, ``credentials/crypto.py``)
    with its own identity as associated data, so the ciphertext opens only for this row.
    Nothing here is ever returned by any route or tool; the broker alone opens it."""

    __tablename__ = "credential_secrets"

    ref: Mapped[str] = mapped_column(String(80), primary_key=True)
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    destination: Mapped[str] = mapped_column(String(120))
    origin: Mapped[str] = mapped_column(String(300))
    scheme: Mapped[str] = mapped_column(String(20))
    label: Mapped[str] = mapped_column(String(200))
    sealed: Mapped[bytes] = mapped_column(LargeBinary())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_credential_secrets_member", "member"),
        CheckConstraint("length(sealed) >= 28", name="sealed"),
    )


class CredentialReceipt(Base):
    """The durable, credential-free record that a one-shot thing happened once: a form's
    nonce was claimed, or one brokered request was sent. ``nonce`` is UNIQUE, so a second
    claim fails in the database; the status moves from ``claimed`` to one terminal by
    compare-and-set. It holds identity and status only: no value, argument, body or result
    (R-397, R-398)."""

    __tablename__ = "credential_receipts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(120))
    kind: Mapped[str] = mapped_column(String(20))
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    destination: Mapped[str] = mapped_column(String(120))
    origin: Mapped[str] = mapped_column(String(300))
    credential_ref: Mapped[str | None] = mapped_column(String(80))
    retention: Mapped[str | None] = mapped_column(String(20))
    operation: Mapped[str | None] = mapped_column(String(200))
    effect: Mapped[str | None] = mapped_column(String(20))
    run_id: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(20))
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("nonce", name="uq_credential_receipts_nonce"),
        Index("ix_credential_receipts_member", "member", "claimed_at"),
        CheckConstraint("kind IN ('form', 'request')", name="kind"),
        CheckConstraint(
            "status IN ('claimed', 'stored', 'succeeded', 'failed', 'ambiguous')",
            name="status"),
        CheckConstraint("retention IS NULL OR retention IN ('once', 'remember')",
                        name="retention"),
        # A form ends stored or refused; a request ends succeeded, failed or ambiguous.
        CheckConstraint(
            "(kind = 'form' AND status IN ('claimed', 'stored', 'failed')) OR "
            "(kind = 'request' AND status <> 'stored' AND operation IS NOT NULL)",
            name="kind_status"),
        CheckConstraint("(status = 'claimed') = (settled_at IS NULL)", name="settled"),
    )


# --- external OpenAPI sources (migration 0017) ---------------------------------------------

#: A member owns at most this many external OpenAPI sources (R-402): the slot column and its
#: CHECK hold it in the database, one slot per source.
MAX_OPENAPI_SOURCES_PER_MEMBER = 100


class OpenApiSource(Base):
    """A member's external OpenAPI source: a pointer only (R-376) — never a copy of the
    schema, a response or a credential. ``slot`` is unique per owner and below
    :data:`MAX_OPENAPI_SOURCES_PER_MEMBER`, so the database refuses a 101st source."""

    __tablename__ = "openapi_sources"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    owner: Mapped[str] = mapped_column(ForeignKey("members.id"))
    slot: Mapped[int] = mapped_column(Integer)
    schema_url: Mapped[str] = mapped_column(String(2048))
    api_base: Mapped[str] = mapped_column(String(2048))
    cross_origin: Mapped[bool] = mapped_column(Boolean)
    enabled: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("owner", "slot", name="uq_openapi_sources_owner_slot"),
        CheckConstraint(f"slot >= 0 AND slot < {MAX_OPENAPI_SOURCES_PER_MEMBER}", name="slot"),
        CheckConstraint("schema_url LIKE 'https://%'", name="schema_url_https"),
        CheckConstraint("api_base LIKE 'https://%'", name="api_base_https"),
    )


CREDENTIAL_REQUEST_STATUSES = ("pending", "submitted", "expired", "cancelled")


class CredentialRequest(Base):
    """A tool call paused for a credential (docs/credentials.md, "A call that needs a
    credential"): the run waits, as for an approval, until the member submits the signed form
    issued for this one call, cancels it, or it expires. It holds identity and status only —
    never a value; ``credential_ref`` is the opaque reference of the use-once value the
    broker holds in memory. A consumed approval binds at most one paused call (UNIQUE
    ``approval_id``), and the resumed call takes the outcome once (``resumed_at`` set by
    compare-and-set)."""

    __tablename__ = "credential_requests"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"))
    call_id: Mapped[str] = mapped_column(String(200))
    member: Mapped[str] = mapped_column(ForeignKey("members.id"))
    tool: Mapped[str] = mapped_column(String(200))
    destination: Mapped[str] = mapped_column(String(120))
    origin: Mapped[str] = mapped_column(String(300))
    effect: Mapped[str] = mapped_column(String(20))
    #: The digest of the call's exact argument text (the approval digest).
    args_digest: Mapped[str] = mapped_column(String(64))
    approval_id: Mapped[str | None] = mapped_column(
        ForeignKey("approvals.id", ondelete="CASCADE"))
    #: What authorized the call before it paused (``tools/authorization.py``).
    authorized_by: Mapped[str] = mapped_column(String(32))
    nonce: Mapped[str] = mapped_column(String(120))
    status: Mapped[str] = mapped_column(String(16))
    credential_ref: Mapped[str | None] = mapped_column(String(80))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("approval_id", name="uq_credential_requests_approval_id"),
        UniqueConstraint("nonce", name="uq_credential_requests_nonce"),
        CheckConstraint(_in("status", CREDENTIAL_REQUEST_STATUSES), name="status"),
        CheckConstraint("effect IN ('read', 'write', 'sensitive')", name="effect"),
        CheckConstraint("authorized_by IN ('not_required', 'never_ask', 'conversation_grant', "
                        "'one_shot_approval')", name="authorized_by"),
        # A consumed approval is what a one-shot approval authorization names, and only it.
        CheckConstraint("(authorized_by = 'one_shot_approval') = (approval_id IS NOT NULL)",
                        name="approval_authorized"),
        CheckConstraint("(status = 'pending') = (settled_at IS NULL)", name="settled"),
        CheckConstraint("(status = 'submitted') = (credential_ref IS NOT NULL)",
                        name="submitted_ref"),
        CheckConstraint("resumed_at IS NULL OR status <> 'pending'", name="resumed"),
        Index("ix_credential_requests_run_call", "run_id", "call_id"),
        Index("ix_credential_requests_member_status", "member", "status"),
    )
