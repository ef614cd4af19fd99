"""durable tasks: saved prompts fired now, on a cadence, or as one background attempt

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-03

``tasks`` holds a member's saved prompt, its target room and cadence; ``next_due_at`` is the
one scheduling fact, moved forward by a compare-and-set. ``task_firings`` is unique per
(task, key) — ``due:<time>`` for a scheduled firing — so a due time fires once across
replicas, and unique per run. Both are new tables: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("interval_seconds", sa.Integer(), nullable=True),
        sa.Column("next_due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("missed_firings", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('active', 'paused')", name=op.f("ck_tasks_status")),
        sa.CheckConstraint("length(name) >= 1", name=op.f("ck_tasks_name")),
        sa.CheckConstraint("length(prompt) >= 1", name=op.f("ck_tasks_prompt")),
        sa.CheckConstraint("interval_seconds IS NULL OR interval_seconds >= 60",
                           name=op.f("ck_tasks_interval")),
        sa.CheckConstraint("next_due_at IS NULL OR (status = 'active' AND "
                           "interval_seconds IS NOT NULL)", name=op.f("ck_tasks_due")),
        sa.CheckConstraint("version >= 1 AND missed_firings >= 0",
                           name=op.f("ck_tasks_counters")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"], name=op.f("fk_tasks_owner_members")),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"],
                                name=op.f("fk_tasks_conversation_id_conversations"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index("ix_tasks_due", ["status", "next_due_at"], unique=False)
        batch_op.create_index("ix_tasks_owner", ["owner"], unique=False)

    op.create_table(
        "task_firings",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("posture", sa.String(length=16), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("error", sa.String(length=300), nullable=True),
        sa.Column("task_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('scheduled', 'run_now', 'safe_test', 'background')",
                           name=op.f("ck_task_firings_kind")),
        sa.CheckConstraint("posture IN ('task_run', 'task_test')",
                           name=op.f("ck_task_firings_posture")),
        sa.CheckConstraint("(kind = 'safe_test') = (posture = 'task_test')",
                           name=op.f("ck_task_firings_test_posture")),
        sa.CheckConstraint("run_id IS NULL OR error IS NULL",
                           name=op.f("ck_task_firings_outcome")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"],
                                name=op.f("fk_task_firings_task_id_tasks"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"],
                                name=op.f("fk_task_firings_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_firings")),
        sa.UniqueConstraint("task_id", "key", name="uq_task_firings_task_key"),
        sa.UniqueConstraint("run_id", name="uq_task_firings_run"),
    )
    with op.batch_alter_table("task_firings", schema=None) as batch_op:
        batch_op.create_index("ix_task_firings_task_created", ["task_id", "created_at"],
                              unique=False)


def downgrade() -> None:
    op.drop_table("task_firings")
    op.drop_table("tasks")
