"""validate renderable artifact attestation

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

PostgreSQL: validate the NOT VALID constraint 0006 added, under SHARE UPDATE EXCLUSIVE (reads
and writes continue). SQLite checked every row when 0006 rebuilt the table: nothing to do.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.execute("ALTER TABLE artifact_versions VALIDATE CONSTRAINT "
                   "ck_artifact_versions_attestation")


def downgrade() -> None:
    # A validated constraint needs no undoing; 0006's downgrade drops it.
    pass
