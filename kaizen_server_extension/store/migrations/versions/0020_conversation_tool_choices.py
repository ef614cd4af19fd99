"""conversation tool choices: the member's per-conversation narrowing of source tools

Revision ID: 0020
Revises: 0018
Create Date: 2026-12-06

``conversation_tool_choices`` holds the source tools (an exact tool, a source, a family or
every source) a member left out of their turns in one conversation: one row per (member,
conversation, name), its primary key. A new table: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversation_tool_choices",
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column("chosen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_conversation_tool_choices_member_members")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_conversation_tool_choices_conversation_id_conversations"),
            ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("member", "conversation_id", "tool",
                                name=op.f("pk_conversation_tool_choices")),
    )


def downgrade() -> None:
    op.drop_table("conversation_tool_choices")
