"""files_and_batches: the Files API's files, a tenant's storage cap, the Batch API's batches
and their lines, generic leases, and usage rows marked with their batch

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_uid", sa.String(length=32), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # A tenant's files newest first (the list), and retention's purge, oldest first.
    op.create_index("ix_files_tenant_created", "files", ["tenant_uid", "created_at"])
    op.create_index("ix_files_expires", "files", ["expires_at"])
    # A tenant's stored responses, summed against its storage cap.
    op.create_index("ix_stored_responses_tenant", "stored_responses", ["tenant_uid"])
    with op.batch_alter_table("quotas") as table:
        table.add_column(sa.Column("storage_bytes", sa.BigInteger(), nullable=True))
        table.add_column(sa.Column("batch_tokens_enqueued", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("usage") as table:
        table.add_column(sa.Column("batch_id", sa.String(length=64), nullable=True))
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_uid", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=False),
        sa.Column("endpoint", sa.String(length=32), nullable=False),
        sa.Column("input_file_id", sa.String(length=64), nullable=False),
        sa.Column("completion_window", sa.String(length=16), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("pins", sa.JSON(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("output_file_id", sa.String(length=64), nullable=True),
        sa.Column("error_file_id", sa.String(length=64), nullable=True),
        *(
            sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)
            for name, nullable in (
                ("created_at", False),
                ("expires_at", False),
                ("in_progress_at", True),
                ("finalizing_at", True),
                ("completed_at", True),
                ("failed_at", True),
                ("expired_at", True),
                ("cancelling_at", True),
                ("cancelled_at", True),
            )
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_batches_tenant_created", "batches", ["tenant_uid", "created_at"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.Text(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("cost", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id", "line"),
    )


def downgrade() -> None:
    op.drop_table("batch_lines")
    op.drop_index("ix_batches_status", "batches")
    op.drop_index("ix_batches_tenant_created", "batches")
    op.drop_table("batches")
    op.drop_table("leases")
    with op.batch_alter_table("usage") as table:
        table.drop_column("batch_id")
    with op.batch_alter_table("quotas") as table:
        table.drop_column("batch_tokens_enqueued")
        table.drop_column("storage_bytes")
    op.drop_index("ix_stored_responses_tenant", "stored_responses")
    op.drop_index("ix_files_expires", "files")
    op.drop_index("ix_files_tenant_created", "files")
    op.drop_table("files")
