"""legacy artifact quarantine

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

Rows written before the attestation boundary cannot prove they came from a trusted producer.
Every version whose kind and language form the reserved renderable pair is reclassified as
ordinary JSON code and loses any attestation it claimed. Content, title, identity, lineage,
version history, ownership and timestamps stay exactly as they were: only ``language`` and
``attestation`` change, and the bytes are never interpreted as an envelope (R-129).

The downgrade is intentionally a no-op: promoting arbitrary JSON back to the reserved language
would fabricate attestation.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

RESERVED = "kind = 'code' AND language = 'renderable-artifact'"


def quarantine() -> None:
    """Reclassify reserved-pair rows; the immutability trigger is lifted for this one UPDATE."""
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("DROP TRIGGER IF EXISTS artifact_versions_immutable")
    else:
        op.execute("ALTER TABLE artifact_versions DISABLE TRIGGER artifact_versions_immutable")
    op.execute(
        f"UPDATE artifact_versions SET language = 'json', attestation = NULL WHERE {RESERVED}"
    )
    if sqlite:
        op.execute(
            "CREATE TRIGGER artifact_versions_immutable BEFORE UPDATE ON artifact_versions "
            "BEGIN SELECT RAISE(ABORT, 'artifact_versions rows are immutable'); END"
        )
    else:
        op.execute("ALTER TABLE artifact_versions ENABLE TRIGGER artifact_versions_immutable")


def upgrade() -> None:
    quarantine()


def downgrade() -> None:
    # Intentionally nothing: see the module docstring.
    pass
