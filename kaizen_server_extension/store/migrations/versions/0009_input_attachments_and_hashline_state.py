"""input attachments and Hashline workspace state

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30

``input_attachments`` pins each file a member attached to a message to one exact, completed
artifact version (a composite foreign key onto ``artifact_versions``), with its digest, size,
file name and media type (R-449, R-454). ``hashline_versions`` and ``hashline_registers`` keep
the Hashline snapshots and named registers of each (actor, conversation) in trusted state, so
a tag survives a kernel lease's release or a replica change; a CHECK on ``slot`` bounds the
history to four versions per path (R-159). All three are new tables: nothing is rewritten.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "input_attachments",
        sa.Column("input_id", sa.String(length=64), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("filename", sa.String(length=300), nullable=False),
        sa.Column("media_type", sa.String(length=200), nullable=False),
        sa.CheckConstraint("ordinal >= 0 AND ordinal < 8",
                           name=op.f("ck_input_attachments_ordinal")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_input_attachments_version")),
        sa.CheckConstraint("size >= 0", name=op.f("ck_input_attachments_size")),
        sa.CheckConstraint("length(digest) = 64", name=op.f("ck_input_attachments_digest")),
        sa.CheckConstraint("length(filename) >= 1",
                           name=op.f("ck_input_attachments_filename")),
        sa.ForeignKeyConstraint(
            ["input_id"], ["accepted_inputs.id"],
            name=op.f("fk_input_attachments_input_id_accepted_inputs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["artifact_id", "version"],
            ["artifact_versions.artifact_id", "artifact_versions.version"],
            name="fk_input_attachments_artifact_version"),
        sa.PrimaryKeyConstraint("input_id", "ordinal", name=op.f("pk_input_attachments")),
        sa.UniqueConstraint("input_id", "artifact_id", name="uq_input_attachments_artifact"),
    )
    op.create_table(
        "hashline_versions",
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(length=8), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("seen", _json(), nullable=False),
        sa.Column("touched", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("slot >= 0 AND slot < 4", name=op.f("ck_hashline_versions_slot")),
        sa.ForeignKeyConstraint(["actor"], ["members.id"],
                                name=op.f("fk_hashline_versions_actor_members")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_hashline_versions_conversation_id_conversations"),
            ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("actor", "conversation_id", "path", "slot",
                                name=op.f("pk_hashline_versions")),
    )
    op.create_table(
        "hashline_registers",
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("rows", _json(), nullable=False),
        sa.ForeignKeyConstraint(["actor"], ["members.id"],
                                name=op.f("fk_hashline_registers_actor_members")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_hashline_registers_conversation_id_conversations"),
            ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("actor", "conversation_id", "name",
                                name=op.f("pk_hashline_registers")),
    )


def downgrade() -> None:
    op.drop_table("hashline_registers")
    op.drop_table("hashline_versions")
    op.drop_table("input_attachments")
