"""files_and_batches: the Files API's files, and a tenant's storage cap

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


def downgrade() -> None:
    with op.batch_alter_table("quotas") as table:
        table.drop_column("storage_bytes")
    op.drop_index("ix_stored_responses_tenant", "stored_responses")
    op.drop_index("ix_files_expires", "files")
    op.drop_index("ix_files_tenant_created", "files")
    op.drop_table("files")
