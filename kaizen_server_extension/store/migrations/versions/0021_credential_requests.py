"""credential_requests: a tool call paused for a credential form

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

A call of an External OpenAPI operation that needs a credential the member has not given
pauses (its run waits as for an approval) until the member submits the signed form issued
for that one call, cancels it, or it expires (docs/credentials.md). The row holds identity
and status only, never a value. UNIQUE ``approval_id``: a consumed approval binds at most one
paused call; UNIQUE ``nonce``: the form's nonce names one request. A new table: nothing is
rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "credential_requests",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("call_id", sa.String(length=200), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column("destination", sa.String(length=120), nullable=False),
        sa.Column("origin", sa.String(length=300), nullable=False),
        sa.Column("effect", sa.String(length=20), nullable=False),
        sa.Column("args_digest", sa.String(length=64), nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=True),
        sa.Column("authorized_by", sa.String(length=32), nullable=False),
        sa.Column("nonce", sa.String(length=120), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("credential_ref", sa.String(length=80), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'submitted', 'expired', 'cancelled')",
                           name=op.f("ck_credential_requests_status")),
        sa.CheckConstraint("effect IN ('read', 'write', 'sensitive')",
                           name=op.f("ck_credential_requests_effect")),
        sa.CheckConstraint("authorized_by IN ('not_required', 'never_ask', "
                           "'conversation_grant', 'one_shot_approval')",
                           name=op.f("ck_credential_requests_authorized_by")),
        sa.CheckConstraint("(authorized_by = 'one_shot_approval') = (approval_id IS NOT NULL)",
                           name=op.f("ck_credential_requests_approval_authorized")),
        sa.CheckConstraint("(status = 'pending') = (settled_at IS NULL)",
                           name=op.f("ck_credential_requests_settled")),
        sa.CheckConstraint("(status = 'submitted') = (credential_ref IS NOT NULL)",
                           name=op.f("ck_credential_requests_submitted_ref")),
        sa.CheckConstraint("resumed_at IS NULL OR status <> 'pending'",
                           name=op.f("ck_credential_requests_resumed")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE",
                                name=op.f("fk_credential_requests_run_id_runs")),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="CASCADE",
                                name=op.f("fk_credential_requests_conversation_id_conversations")),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_credential_requests_member_members")),
        sa.ForeignKeyConstraint(["approval_id"], ["approvals.id"], ondelete="CASCADE",
                                name=op.f("fk_credential_requests_approval_id_approvals")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credential_requests")),
        sa.UniqueConstraint("approval_id", name="uq_credential_requests_approval_id"),
        sa.UniqueConstraint("nonce", name="uq_credential_requests_nonce"),
    )
    op.create_index("ix_credential_requests_run_call", "credential_requests",
                    ["run_id", "call_id"])
    op.create_index("ix_credential_requests_member_status", "credential_requests",
                    ["member", "status"])


def downgrade() -> None:
    op.drop_index("ix_credential_requests_member_status", table_name="credential_requests")
    op.drop_index("ix_credential_requests_run_call", table_name="credential_requests")
    op.drop_table("credential_requests")
