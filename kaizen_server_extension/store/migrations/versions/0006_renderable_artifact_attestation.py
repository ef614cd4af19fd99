"""renderable artifact attestation constraint

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

Installs the CHECK that rejects the reserved renderable pair without the server-attestation
marker (R-119), so an older replica that cannot stamp the marker fails closed (R-130).

On PostgreSQL the constraint is added NOT VALID, which takes only a brief lock and scans
nothing; 0007 validates it under the lower validation lock. SQLite cannot add a constraint
in place, so the table is rebuilt (its rows are re-inserted, and so checked, immediately) and
its immutability trigger is recreated.

Any reserved row an old replica wrote after 0005 ran is quarantined again first, so the
validation that follows cannot fail on it.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

CHECK = ("NOT (kind = 'code' AND language = 'renderable-artifact') "
         "OR attestation IS NOT NULL")
NAME = "ck_artifact_versions_attestation"


def _requarantine_unmarked() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("DROP TRIGGER IF EXISTS artifact_versions_immutable")
    else:
        op.execute("ALTER TABLE artifact_versions DISABLE TRIGGER artifact_versions_immutable")
    op.execute(
        "UPDATE artifact_versions SET language = 'json' WHERE kind = 'code' "
        "AND language = 'renderable-artifact' AND attestation IS NULL"
    )
    if not sqlite:
        op.execute("ALTER TABLE artifact_versions ENABLE TRIGGER artifact_versions_immutable")


def _sqlite_trigger() -> None:
    op.execute("DROP TRIGGER IF EXISTS artifact_versions_immutable")
    op.execute(
        "CREATE TRIGGER artifact_versions_immutable BEFORE UPDATE ON artifact_versions "
        "BEGIN SELECT RAISE(ABORT, 'artifact_versions rows are immutable'); END"
    )


def upgrade() -> None:
    _requarantine_unmarked()
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("artifact_versions", recreate="always") as batch_op:
            batch_op.create_check_constraint(op.f(NAME), CHECK)
        _sqlite_trigger()
    else:
        op.execute(f"ALTER TABLE artifact_versions ADD CONSTRAINT {NAME} CHECK ({CHECK}) "
                   "NOT VALID")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS artifact_versions_immutable")
        with op.batch_alter_table("artifact_versions", recreate="always") as batch_op:
            batch_op.drop_constraint(op.f(NAME), type_="check")
        _sqlite_trigger()
    else:
        op.execute(f"ALTER TABLE artifact_versions DROP CONSTRAINT {NAME}")
