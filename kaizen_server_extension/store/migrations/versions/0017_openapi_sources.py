"""openapi_sources: members' external OpenAPI sources, pointers only

Revision ID: 0017
Revises: 0019
Create Date: 2026-12-04

One row per source: id, owner, schema URL, API base, cross-origin consent, enabled — never a
copy of the schema, a response or a credential (R-376). The database holds the limit of 100
sources per member (R-402): each source takes a ``slot`` unique per owner with
``0 <= slot < 100``. Both URLs must be ``https://`` (R-375); the server checks the rest
(no user information, query or fragment) before it writes. A new table: nothing is
rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "openapi_sources",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("schema_url", sa.String(length=2048), nullable=False),
        sa.Column("api_base", sa.String(length=2048), nullable=False),
        sa.Column("cross_origin", sa.Boolean(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("slot >= 0 AND slot < 100", name=op.f("ck_openapi_sources_slot")),
        sa.CheckConstraint("schema_url LIKE 'https://%'",
                           name=op.f("ck_openapi_sources_schema_url_https")),
        sa.CheckConstraint("api_base LIKE 'https://%'",
                           name=op.f("ck_openapi_sources_api_base_https")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"],
                                name=op.f("fk_openapi_sources_owner_members")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_openapi_sources")),
        sa.UniqueConstraint("owner", "slot", name="uq_openapi_sources_owner_slot"),
    )


def downgrade() -> None:
    op.drop_table("openapi_sources")
