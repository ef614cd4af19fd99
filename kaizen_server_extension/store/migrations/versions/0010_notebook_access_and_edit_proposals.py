"""notebook kernel access and reviewed notebook edit proposals

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

``notebook_kernel_access`` records, per member and conversation, that the member allowed
inspect_notebook_kernel's fixed probe there; no row, no probe. ``notebook_edit_proposals``
and ``notebook_edit_cells`` keep each propose_notebook_edit proposal against the exact pinned
notebook version it was read from (a composite foreign key onto ``artifact_versions``), and
each cell's one decision and its outcome in the member's browser; CHECK constraints hold the
lifecycle's shape (an outcome only for an accepted cell; run-after only for an inserted code
cell; sources as each op needs them). New tables only: nothing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "notebook_kernel_access",
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_notebook_kernel_access_member_members")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_notebook_kernel_access_conversation_id_conversations"),
            ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("member", "conversation_id",
                                name=op.f("pk_notebook_kernel_access")),
    )
    op.create_table(
        "notebook_edit_proposals",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("member", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("artifact_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("base_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(base_fingerprint) = 64",
                           name=op.f("ck_notebook_edit_proposals_base_fingerprint")),
        sa.CheckConstraint("length(path) >= 1", name=op.f("ck_notebook_edit_proposals_path")),
        sa.ForeignKeyConstraint(["member"], ["members.id"],
                                name=op.f("fk_notebook_edit_proposals_member_members")),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["conversations.id"],
            name=op.f("fk_notebook_edit_proposals_conversation_id_conversations"),
            ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"],
                                name=op.f("fk_notebook_edit_proposals_run_id_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["artifact_id", "version"],
            ["artifact_versions.artifact_id", "artifact_versions.version"],
            name="fk_notebook_edit_proposals_artifact_version"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notebook_edit_proposals")),
    )
    op.create_index(op.f("ix_notebook_edit_proposals_conversation_id"),
                    "notebook_edit_proposals", ["conversation_id"], unique=False)
    op.create_table(
        "notebook_edit_cells",
        sa.Column("proposal_id", sa.String(length=64), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=8), nullable=False),
        sa.Column("cell_id", sa.String(length=64), nullable=False),
        sa.Column("after_cell_id", sa.String(length=64), nullable=True),
        sa.Column("cell_type", sa.String(length=8), nullable=False),
        sa.Column("base_source", sa.Text(), nullable=True),
        sa.Column("base_digest", sa.String(length=64), nullable=True),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("decision", sa.String(length=8), nullable=False),
        sa.Column("run_after", sa.Boolean(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=8), nullable=True),
        sa.Column("outcome_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("ordinal >= 0 AND ordinal < 16",
                           name=op.f("ck_notebook_edit_cells_ordinal")),
        sa.CheckConstraint(_in("op", ("insert", "replace", "delete")),
                           name=op.f("ck_notebook_edit_cells_op")),
        sa.CheckConstraint(_in("cell_type", ("code", "markdown", "raw")),
                           name=op.f("ck_notebook_edit_cells_cell_type")),
        sa.CheckConstraint(_in("decision", ("pending", "accepted", "rejected")),
                           name=op.f("ck_notebook_edit_cells_decision")),
        sa.CheckConstraint(
            f"outcome IS NULL OR ({_in('outcome', ('applied', 'stale', 'failed', 'undone'))} "
            "AND decision = 'accepted')", name=op.f("ck_notebook_edit_cells_outcome")),
        sa.CheckConstraint("(op = 'delete') = (source IS NULL)",
                           name=op.f("ck_notebook_edit_cells_source")),
        sa.CheckConstraint("(op = 'insert') = (base_digest IS NULL) AND "
                           "(base_digest IS NULL) = (base_source IS NULL)",
                           name=op.f("ck_notebook_edit_cells_base")),
        sa.CheckConstraint("after_cell_id IS NULL OR op = 'insert'",
                           name=op.f("ck_notebook_edit_cells_anchor")),
        sa.CheckConstraint("NOT run_after OR (op = 'insert' AND cell_type = 'code' AND "
                           "decision = 'accepted')", name=op.f("ck_notebook_edit_cells_run_after")),
        sa.ForeignKeyConstraint(
            ["proposal_id"], ["notebook_edit_proposals.id"],
            name=op.f("fk_notebook_edit_cells_proposal_id_notebook_edit_proposals"),
            ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("proposal_id", "ordinal", name=op.f("pk_notebook_edit_cells")),
        sa.UniqueConstraint("proposal_id", "cell_id", name="uq_notebook_edit_cells_cell"),
    )


def downgrade() -> None:
    op.drop_table("notebook_edit_cells")
    op.drop_index(op.f("ix_notebook_edit_proposals_conversation_id"),
                  table_name="notebook_edit_proposals")
    op.drop_table("notebook_edit_proposals")
    op.drop_table("notebook_kernel_access")
