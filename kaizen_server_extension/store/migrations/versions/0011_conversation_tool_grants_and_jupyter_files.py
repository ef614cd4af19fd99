"""conversation tool grants and the member's Jupyter files

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-14

``conversation_tool_grants`` holds "Allow for this conversation": one row per (member,
conversation, tool), its primary key, read with the call's other facts in ``open_call``; a
CHECK keeps sensitive and undeclared tools out (they confirm every call, R-152).
``jupyter_file_sources`` names the member-owned artifact whose versions are the copies of one
file of the Jupyter contents tree read through the ContentsManager. Both are new tables:
nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversation_tool_grants",
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column("capability", sa.String(length=20), nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=True),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("capability = 'write'",
                           name=op.f("ck_conversation_tool_grants_capability")),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_conversation_tool_grants_member_members")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_conversation_tool_grants_conversation_id_conversations"),
            ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["approval_id"], ["approvals.id"],
            name=op.f("fk_conversation_tool_grants_approval_id_approvals"),
            ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("member", "conversation_id", "tool",
                                name=op.f("pk_conversation_tool_grants")),
    )
    op.create_table(
        "jupyter_file_sources",
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(path) >= 1", name=op.f("ck_jupyter_file_sources_path")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"],
                                name=op.f("fk_jupyter_file_sources_owner_members")),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name=op.f("fk_jupyter_file_sources_artifact_id_artifacts"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("owner", "path", name=op.f("pk_jupyter_file_sources")),
        sa.UniqueConstraint("artifact_id", name="uq_jupyter_file_sources_artifact"),
    )


def downgrade() -> None:
    op.drop_table("jupyter_file_sources")
    op.drop_table("conversation_tool_grants")
