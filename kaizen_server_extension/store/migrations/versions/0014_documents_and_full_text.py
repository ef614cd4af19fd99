"""documents for retrieval: versions, room shares, chunks and the database's full-text index

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

``documents`` roots, immutable ``document_versions`` (bytes and extracted text),
``document_chunks`` (the passages retrieval cites, each with an opaque ``chunk_id``) and
``document_shares`` (a document shared into a room). The full-text index is the database's
own: on SQLite an external-content FTS5 table over ``document_chunks.body`` kept in step by
insert/delete triggers (a cascade delete fires them too); on PostgreSQL a generated, stored
``search_vector`` tsvector column with a GIN index. Versions and chunks refuse UPDATE.
All new tables: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

IMMUTABLE = ("document_versions", "document_chunks")


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("current_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("current_version >= 1", name=op.f("ck_documents_current_version")),
        sa.CheckConstraint("length(title) >= 1", name=op.f("ck_documents_title")),
        sa.ForeignKeyConstraint(["owner"], ["members.id"],
                                name=op.f("fk_documents_owner_members")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_documents")),
    )
    with op.batch_alter_table("documents", schema=None) as batch_op:
        batch_op.create_index("ix_documents_owner", ["owner", "updated_at"], unique=False)

    op.create_table(
        "document_versions",
        sa.Column("document_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("filename", sa.String(length=300), nullable=False),
        sa.Column("media_type", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("author", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("version >= 1", name=op.f("ck_document_versions_version")),
        sa.CheckConstraint("size >= 0", name=op.f("ck_document_versions_size")),
        sa.ForeignKeyConstraint(["document_id"], ["documents.id"],
                                name=op.f("fk_document_versions_document_id_documents"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["author"], ["members.id"],
                                name=op.f("fk_document_versions_author_members")),
        sa.PrimaryKeyConstraint("document_id", "version", name=op.f("pk_document_versions")),
    )

    op.create_table(
        "document_chunks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("chunk_id", sa.String(length=64), nullable=False),
        sa.Column("document_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("locator", sa.String(length=200), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.CheckConstraint("ordinal >= 0", name=op.f("ck_document_chunks_ordinal")),
        sa.ForeignKeyConstraint(["document_id", "version"],
                                ["document_versions.document_id", "document_versions.version"],
                                name="fk_document_chunks_version", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_document_chunks")),
        sa.UniqueConstraint("chunk_id", name=op.f("uq_document_chunks_chunk_id")),
        sa.UniqueConstraint("document_id", "version", "ordinal",
                            name="uq_document_chunks_version_ordinal"),
    )

    op.create_table(
        "document_shares",
        sa.Column("document_id", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("shared_by", sa.String(length=200), nullable=False),
        sa.Column("shared_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["document_id"], ["documents.id"],
                                name=op.f("fk_document_shares_document_id_documents"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"],
                                name=op.f("fk_document_shares_conversation_id_conversations"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["shared_by"], ["members.id"],
                                name=op.f("fk_document_shares_shared_by_members")),
        sa.PrimaryKeyConstraint("document_id", "conversation_id",
                                name=op.f("pk_document_shares")),
    )
    with op.batch_alter_table("document_shares", schema=None) as batch_op:
        batch_op.create_index("ix_document_shares_conversation", ["conversation_id"],
                              unique=False)

    if op.get_bind().dialect.name == "sqlite":
        _sqlite_full_text()
    else:
        _postgresql_full_text()


def _sqlite_full_text() -> None:
    op.execute("CREATE VIRTUAL TABLE document_chunks_fts USING fts5(body, "
               "content='document_chunks', content_rowid='id', "
               "tokenize='porter unicode61 remove_diacritics 2')")
    op.execute("CREATE TRIGGER document_chunks_fts_insert AFTER INSERT ON document_chunks "
               "BEGIN INSERT INTO document_chunks_fts(rowid, body) VALUES (new.id, new.body); "
               "END")
    op.execute("CREATE TRIGGER document_chunks_fts_delete AFTER DELETE ON document_chunks "
               "BEGIN INSERT INTO document_chunks_fts(document_chunks_fts, rowid, body) "
               "VALUES ('delete', old.id, old.body); END")
    for table in IMMUTABLE:
        op.execute(f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} "
                   f"BEGIN SELECT RAISE(ABORT, '{table} rows are immutable'); END")


def _postgresql_full_text() -> None:
    op.execute("ALTER TABLE document_chunks ADD COLUMN search_vector tsvector "
               "GENERATED ALWAYS AS (to_tsvector('english', body)) STORED")
    op.execute("CREATE INDEX ix_document_chunks_search_vector ON document_chunks "
               "USING gin (search_vector)")
    for table in IMMUTABLE:
        op.execute(f"CREATE FUNCTION {table}_immutable() RETURNS trigger LANGUAGE plpgsql "
                   f"AS $$ BEGIN RAISE EXCEPTION '{table} rows are immutable'; END $$")
        op.execute(f"CREATE TRIGGER {table}_immutable BEFORE UPDATE ON {table} "
                   f"FOR EACH ROW EXECUTE FUNCTION {table}_immutable()")


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table in IMMUTABLE:
        if sqlite:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_immutable")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_immutable ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {table}_immutable()")
    if sqlite:
        op.execute("DROP TRIGGER IF EXISTS document_chunks_fts_insert")
        op.execute("DROP TRIGGER IF EXISTS document_chunks_fts_delete")
        op.execute("DROP TABLE IF EXISTS document_chunks_fts")
    op.drop_table("document_shares")
    op.drop_table("document_chunks")
    op.drop_table("document_versions")
    op.drop_table("documents")
