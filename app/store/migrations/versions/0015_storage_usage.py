"""storage_usage: each tenant's stored bytes (its files' and stored responses' sizes) as a
running total that the writes keep, backfilled from the rows; the index that summed a tenant's
stored responses goes

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "storage_usage",
        sa.Column("tenant_uid", sa.String(length=32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_uid"),
    )
    op.execute(
        "INSERT INTO storage_usage (tenant_uid, bytes)"
        " SELECT tenant_uid, SUM(size) FROM ("
        "  SELECT tenant_uid, bytes AS size FROM files"
        "  UNION ALL SELECT tenant_uid, size_bytes AS size FROM stored_responses"
        " ) AS stored GROUP BY tenant_uid"
    )
    # Nothing sums a tenant's stored responses any more; each insert would still pay for it.
    op.drop_index("ix_stored_responses_tenant", "stored_responses")


def downgrade() -> None:
    op.create_index("ix_stored_responses_tenant", "stored_responses", ["tenant_uid"])
    op.drop_table("storage_usage")
