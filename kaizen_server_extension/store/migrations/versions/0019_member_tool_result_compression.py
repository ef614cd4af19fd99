"""members.tool_result_compression: the member's opt-in to tool-result compression

Revision ID: 0019
Revises: 0016
Create Date: 2026-12-04

Off for every existing member (the spec's default: compression applies only where a member
opted in). A new column with a server default: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("members", sa.Column("tool_result_compression", sa.Boolean(),
                                       server_default=sa.false(), nullable=False))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+ has it): a batch rebuild of members would drop the
    # table every other table's foreign keys point at, which SQLite refuses.
    op.execute("ALTER TABLE members DROP COLUMN tool_result_compression")
