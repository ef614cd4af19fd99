"""artifacts (immutable versions, staged drafts) and the library

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

The renderable-artifact attestation CHECK is not created here: 0005 quarantines legacy rows,
0006 installs the constraint and 0007 validates it (guardrails: Structured artifact output).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _create_immutability_trigger() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "CREATE TRIGGER artifact_versions_immutable BEFORE UPDATE ON artifact_versions "
            "BEGIN SELECT RAISE(ABORT, 'artifact_versions rows are immutable'); END"
        )
    else:
        op.execute(
            "CREATE FUNCTION artifact_versions_immutable() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RAISE EXCEPTION 'artifact_versions rows are immutable'; END $$"
        )
        op.execute(
            "CREATE TRIGGER artifact_versions_immutable BEFORE UPDATE ON artifact_versions "
            "FOR EACH ROW EXECUTE FUNCTION artifact_versions_immutable()"
        )


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=True),
        sa.Column("source_name", sa.String(length=300), nullable=True),
        sa.Column("derived_from", sa.String(length=64), nullable=True),
        sa.Column("derived_version", sa.Integer(), nullable=True),
        sa.Column("current_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('markdown', 'html', 'svg', 'code', 'mermaid', 'react', 'json', 'graph', 'file')",
            name=op.f("ck_artifacts_kind"),
        ),
        sa.CheckConstraint("current_version >= 1", name=op.f("ck_artifacts_current_version")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"], name=op.f("fk_artifacts_owner_members")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint(
            "owner", "conversation_id", "source_name", name="uq_artifacts_owner_source"
        ),
    )
    op.create_index("ix_artifacts_owner", "artifacts", ["owner", "updated_at"], unique=False)
    op.create_table(
        "artifact_versions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("language", sa.String(length=64), nullable=True),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("mime", sa.String(length=200), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("author", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=True),
        sa.Column("room_id", sa.String(length=64), nullable=True),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("attestation", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("size >= 0", name=op.f("ck_artifact_versions_size")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_artifact_versions_version")),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name=op.f("fk_artifact_versions_artifact_id_artifacts"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact_versions")),
        sa.UniqueConstraint("artifact_id", "version", name="uq_artifact_versions_artifact_version"),
    )
    op.create_index("ix_artifact_versions_room", "artifact_versions", ["room_id"], unique=False)
    op.create_table(
        "artifact_drafts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("language", sa.String(length=64), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("last_receipt", sa.String(length=64), nullable=True),
        sa.Column("last_chunk_digest", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('open', 'finalized', 'discarded')", name=op.f("ck_artifact_drafts_status")
        ),
        sa.CheckConstraint("sequence >= 0", name=op.f("ck_artifact_drafts_sequence")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_artifact_drafts_conversation_id_conversations"), ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner"], ["members.id"], name=op.f("fk_artifact_drafts_owner_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact_drafts")),
    )
    op.create_index(
        "ix_artifact_drafts_owner", "artifact_drafts", ["owner", "status"], unique=False
    )
    op.create_table(
        "library_collections",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner"], ["members.id"], name=op.f("fk_library_collections_owner_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_library_collections")),
    )
    op.create_index(
        "ix_library_collections_owner", "library_collections", ["owner"], unique=False
    )
    op.create_table(
        "library_projects",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner"], ["members.id"], name=op.f("fk_library_projects_owner_members")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_library_projects")),
    )
    op.create_index("ix_library_projects_owner", "library_projects", ["owner"], unique=False)
    op.create_table(
        "library_collection_items",
        sa.Column("collection_id", sa.String(length=64), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=False),
        sa.Column("added_by", sa.String(length=200), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"],
            name=op.f("fk_library_collection_items_artifact_id_artifacts"), ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["collection_id"], ["library_collections.id"],
            name=op.f("fk_library_collection_items_collection_id_library_collections"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "collection_id", "artifact_id", name=op.f("pk_library_collection_items")
        ),
    )
    op.create_table(
        "library_project_items",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("item_kind", sa.String(length=16), nullable=False),
        sa.Column("item_id", sa.String(length=64), nullable=False),
        sa.Column("added_by", sa.String(length=200), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "item_kind IN ('artifact', 'collection', 'project')",
            name=op.f("ck_library_project_items_item_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["library_projects.id"],
            name=op.f("fk_library_project_items_project_id_library_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "project_id", "item_kind", "item_id", name=op.f("pk_library_project_items")
        ),
    )
    _create_immutability_trigger()


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.execute("DROP TRIGGER IF EXISTS artifact_versions_immutable ON artifact_versions")
        op.execute("DROP FUNCTION IF EXISTS artifact_versions_immutable()")
    op.drop_table("library_project_items")
    op.drop_table("library_collection_items")
    op.drop_index("ix_library_projects_owner", table_name="library_projects")
    op.drop_table("library_projects")
    op.drop_index("ix_library_collections_owner", table_name="library_collections")
    op.drop_table("library_collections")
    op.drop_index("ix_artifact_drafts_owner", table_name="artifact_drafts")
    op.drop_table("artifact_drafts")
    op.drop_index("ix_artifact_versions_room", table_name="artifact_versions")
    op.drop_table("artifact_versions")
    op.drop_index("ix_artifacts_owner", table_name="artifacts")
    op.drop_table("artifacts")
