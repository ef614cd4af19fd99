"""documents added from the Jupyter contents tree: which document holds one path's versions

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-04

``document_sources`` names, per (owner, contents-manager path), the document whose versions
are that file as it was each time the member added it (``POST jupyter-documents``): adding the
same path again appends a version instead of a second document. One document has at most one
source (UNIQUE), and deleting the document deletes its source row (CASCADE), so the next add
of that path starts a new document. A new table: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "document_sources",
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("document_id", sa.String(length=64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(path) >= 1", name=op.f("ck_document_sources_path")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"],
                                name=op.f("fk_document_sources_owner_members")),
        sa.ForeignKeyConstraint(
            ["document_id"], ["documents.id"],
            name=op.f("fk_document_sources_document_id_documents"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("owner", "path", name=op.f("pk_document_sources")),
        sa.UniqueConstraint("document_id", name="uq_document_sources_document"),
    )


def downgrade() -> None:
    op.drop_table("document_sources")
