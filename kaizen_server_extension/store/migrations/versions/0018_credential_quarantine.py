"""credential quarantine: remembered credentials, sealed, and credential-free receipts

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04

``credential_secrets`` holds only the credentials a member explicitly chose to remember,
sealed with AES-GCM under a key derived from ``KAIZEN_CREDENTIAL_KEY`` (the database never
sees a plaintext value). ``credential_receipts`` records that a form's nonce was claimed and
that one brokered request was sent: identity and status only, its ``nonce`` UNIQUE so a replay
fails in the database, its status CHECK-limited. Both are new tables: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "credential_secrets",
        sa.Column("ref", sa.String(length=80), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("destination", sa.String(length=120), nullable=False),
        sa.Column("origin", sa.String(length=300), nullable=False),
        sa.Column("scheme", sa.String(length=20), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(sealed) >= 28", name=op.f("ck_credential_secrets_sealed")),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_credential_secrets_member_members")),
        sa.PrimaryKeyConstraint("ref", name=op.f("pk_credential_secrets")),
    )
    op.create_index("ix_credential_secrets_member", "credential_secrets", ["member"])
    op.create_table(
        "credential_receipts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("nonce", sa.String(length=120), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("destination", sa.String(length=120), nullable=False),
        sa.Column("origin", sa.String(length=300), nullable=False),
        sa.Column("credential_ref", sa.String(length=80), nullable=True),
        sa.Column("retention", sa.String(length=20), nullable=True),
        sa.Column("operation", sa.String(length=200), nullable=True),
        sa.Column("effect", sa.String(length=20), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('form', 'request')", name=op.f("ck_credential_receipts_kind")),
        sa.CheckConstraint(
            "status IN ('claimed', 'stored', 'succeeded', 'failed', 'ambiguous')",
            name=op.f("ck_credential_receipts_status")),
        sa.CheckConstraint("retention IS NULL OR retention IN ('once', 'remember')",
                           name=op.f("ck_credential_receipts_retention")),
        sa.CheckConstraint(
            "(kind = 'form' AND status IN ('claimed', 'stored', 'failed')) OR "
            "(kind = 'request' AND status <> 'stored' AND operation IS NOT NULL)",
            name=op.f("ck_credential_receipts_kind_status")),
        sa.CheckConstraint("(status = 'claimed') = (settled_at IS NULL)",
                           name=op.f("ck_credential_receipts_settled")),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_credential_receipts_member_members")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credential_receipts")),
        sa.UniqueConstraint("nonce", name="uq_credential_receipts_nonce"),
    )
    op.create_index("ix_credential_receipts_member", "credential_receipts",
                    ["member", "claimed_at"])


def downgrade() -> None:
    op.drop_index("ix_credential_receipts_member", table_name="credential_receipts")
    op.drop_table("credential_receipts")
    op.drop_index("ix_credential_secrets_member", table_name="credential_secrets")
    op.drop_table("credential_secrets")
