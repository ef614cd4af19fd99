"""completion notifications

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("resource_id", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("attendance", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("dedupe_key", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "NOT (kind IN ('chat', 'prompt') AND attendance = 'attended')",
            name=op.f("ck_notifications_attended"),
        ),
        sa.CheckConstraint(
            "attendance IN ('attended', 'unattended', 'unknown')",
            name=op.f("ck_notifications_attendance_value"),
        ),
        sa.CheckConstraint(
            "kind = 'prompt' OR run_id IS NOT NULL", name=op.f("ck_notifications_run_id")
        ),
        sa.CheckConstraint(
            "kind IN ('chat', 'prompt', 'task_run')", name=op.f("ck_notifications_kind")
        ),
        sa.ForeignKeyConstraint(
            ["member"], ["members.id"], name=op.f("fk_notifications_member_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
        sa.UniqueConstraint("member", "dedupe_key", name="uq_notifications_member_dedupe"),
    )
    op.create_index(
        "ix_notifications_member_acked",
        "notifications",
        ["member", "acked_at", "created_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_notifications_member_acked", table_name="notifications")
    op.drop_table("notifications")
