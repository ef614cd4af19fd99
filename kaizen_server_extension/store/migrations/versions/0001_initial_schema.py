"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


# Rows the database itself refuses to change: agent versions are immutable and the journal
# is append-only (DESIGN.md: invariants the database holds).
IMMUTABLE_TABLES = ("agent_versions", "journal")


def _create_immutability_triggers() -> None:
    bind = op.get_bind()
    for table in IMMUTABLE_TABLES:
        if bind.dialect.name == "sqlite":
            op.execute(
                f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} rows are immutable'); END"
            )
        else:
            op.execute(
                f"CREATE FUNCTION {table}_immutable() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN RAISE EXCEPTION '{table} rows are immutable'; END $$"
            )
            op.execute(
                f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {table}_immutable()"
            )


def _drop_immutability_triggers() -> None:
    bind = op.get_bind()
    for table in IMMUTABLE_TABLES:
        if bind.dialect.name == "sqlite":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_immutable")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_immutable ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {table}_immutable()")


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_events_conversation", ["conversation_id"], unique=False)

    op.create_table(
        "members",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column(
            "approval_mode", sa.String(length=20), server_default="ask_for_writes", nullable=False
        ),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "approval_mode IN ('always_ask', 'ask_for_writes', 'never_ask')",
            name=op.f("ck_members_approval_mode"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_members")),
    )
    op.create_table(
        "agents",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("current_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("current_version >= 1", name=op.f("ck_agents_current_version")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"], name=op.f("fk_agents_owner_members")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
    )
    op.create_table(
        "agent_versions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("persona", sa.Text(), nullable=False),
        sa.Column(
            "tool_ceiling",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "knowledge_scope",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("mode", sa.String(length=10), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("mode IN ('search', 'chat')", name=op.f("ck_agent_versions_mode")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_agent_versions_version")),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_versions_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_versions")),
        sa.UniqueConstraint("agent_id", "version", name="uq_agent_versions_agent_version"),
    )
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("shared", sa.Boolean(), nullable=False),
        sa.Column("audience_version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("last_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_position", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("audience_version >= 1", name=op.f("ck_conversations_audience_version")),
        sa.CheckConstraint("last_position >= 0", name=op.f("ck_conversations_last_position")),
        sa.CheckConstraint("last_seq >= 0", name=op.f("ck_conversations_last_seq")),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_conversations_agent_id_agents")
        ),
        sa.ForeignKeyConstraint(
            ["owner"], ["members.id"], name=op.f("fk_conversations_owner_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversations")),
    )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.create_index("ix_conversations_owner", ["owner"], unique=False)

    op.create_table(
        "accepted_inputs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("text_digest", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('message', 'steering')", name=op.f("ck_accepted_inputs_kind")),
        sa.CheckConstraint("position >= 1", name=op.f("ck_accepted_inputs_position")),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_accepted_inputs_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["member"], ["members.id"], name=op.f("fk_accepted_inputs_member_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accepted_inputs")),
        sa.UniqueConstraint("conversation_id", "idempotency_key", name="uq_inputs_idempotency"),
        sa.UniqueConstraint("conversation_id", "position", name="uq_inputs_conversation_position"),
    )
    op.create_table(
        "journal",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.CheckConstraint("seq >= 1", name=op.f("ck_journal_seq")),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_journal_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_journal")),
        sa.UniqueConstraint("conversation_id", "seq", name="uq_journal_conversation_seq"),
    )
    op.create_table(
        "participants",
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("member_id", sa.String(length=200), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_participants_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["member_id"], ["members.id"], name=op.f("fk_participants_member_id_members")
        ),
        sa.PrimaryKeyConstraint("conversation_id", "member_id", name=op.f("pk_participants")),
    )
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.create_index("ix_participants_member", ["member_id"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("input_id", sa.String(length=64), nullable=False),
        sa.Column("input_position", sa.BigInteger(), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("agent_version_id", sa.String(length=64), nullable=True),
        sa.Column("audience_version", sa.Integer(), nullable=True),
        sa.Column("resource_digest", sa.String(length=64), nullable=True),
        sa.Column("catalog_digest", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=24), server_default="queued", nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=True),
        sa.Column("fence", sa.Integer(), server_default="0", nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("steps", sa.Integer(), server_default="0", nullable=False),
        sa.Column("tool_calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(status IN ('completed', 'failed', 'answer_unavailable', 'cancelled')) = (settled_at IS NOT NULL)",
            name=op.f("ck_runs_settled"),
        ),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'awaiting_approval', 'completed', 'failed', 'answer_unavailable', 'cancelled')",
            name=op.f("ck_runs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["agent_version_id"],
            ["agent_versions.id"],
            name=op.f("fk_runs_agent_version_id_agent_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_runs_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["input_id"], ["accepted_inputs.id"], name=op.f("fk_runs_input_id_accepted_inputs")
        ),
        sa.ForeignKeyConstraint(["member"], ["members.id"], name=op.f("fk_runs_member_members")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("input_id", name=op.f("uq_runs_input_id")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_conversation_status",
            ["conversation_id", "status", "input_position"],
            unique=False,
        )
        batch_op.create_index(
            "uq_runs_one_active_per_conversation",
            ["conversation_id"],
            unique=True,
            sqlite_where=sa.text("status IN ('running', 'awaiting_approval')"),
            postgresql_where=sa.text("status IN ('running', 'awaiting_approval')"),
        )

    _create_immutability_triggers()


def downgrade() -> None:
    _drop_immutability_triggers()
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_runs_one_active_per_conversation",
            sqlite_where=sa.text("status IN ('running', 'awaiting_approval')"),
            postgresql_where=sa.text("status IN ('running', 'awaiting_approval')"),
        )
        batch_op.drop_index("ix_runs_conversation_status")

    op.drop_table("runs")
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.drop_index("ix_participants_member")

    op.drop_table("participants")
    op.drop_table("journal")
    op.drop_table("accepted_inputs")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_index("ix_conversations_owner")

    op.drop_table("conversations")
    op.drop_table("agent_versions")
    op.drop_table("agents")
    op.drop_table("members")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_events_conversation")

    op.drop_table("audit_events")
