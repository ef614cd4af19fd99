"""artifact update checkpoints and one remix per source version

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30

``artifact_update_checkpoints`` holds the private building row of a streamed update_artifact:
owner-, run- and call-fenced, kept when the stream is interrupted, resumed by the next turn
and frozen into exactly one new version (R-245, R-444, R-445). A partial unique index allows
one open row per (owner, artifact).

``uq_artifacts_one_derivation`` lets a member derive at most one root from one exact source
version (R-164). Both are new objects, so nothing existing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

OPEN = "status IN ('building', 'interrupted')"
DERIVED = "derived_from IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        "artifact_update_checkpoints",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("call_id", sa.String(length=200), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("frozen_version", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('building', 'interrupted', 'frozen')",
            name=op.f("ck_artifact_update_checkpoints_status"),
        ),
        sa.CheckConstraint(
            "(status = 'frozen') = (frozen_version IS NOT NULL)",
            name=op.f("ck_artifact_update_checkpoints_frozen"),
        ),
        sa.CheckConstraint(
            "base_version >= 1", name=op.f("ck_artifact_update_checkpoints_base_version")
        ),
        sa.CheckConstraint("fence >= 1", name=op.f("ck_artifact_update_checkpoints_fence")),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name=op.f("fk_artifact_update_checkpoints_artifact_id_artifacts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_artifact_update_checkpoints_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner"], ["members.id"], name=op.f("fk_artifact_update_checkpoints_owner_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact_update_checkpoints")),
    )
    op.create_index(
        "uq_artifact_update_checkpoints_open", "artifact_update_checkpoints",
        ["owner", "artifact_id"], unique=True,
        sqlite_where=sa.text(OPEN), postgresql_where=sa.text(OPEN),
    )
    op.create_index(
        "uq_artifacts_one_derivation", "artifacts",
        ["owner", "derived_from", "derived_version"], unique=True,
        sqlite_where=sa.text(DERIVED), postgresql_where=sa.text(DERIVED),
    )


def downgrade() -> None:
    op.drop_index("uq_artifacts_one_derivation", table_name="artifacts")
    op.drop_index("uq_artifact_update_checkpoints_open",
                  table_name="artifact_update_checkpoints")
    op.drop_table("artifact_update_checkpoints")
