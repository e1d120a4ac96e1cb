"""stored_responses: the Responses API's stored responses, per tenant

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_uid", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column("adapter", sa.String(length=100), nullable=True),
        sa.Column("adapter_version", sa.Integer(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # Retention's purge walks it oldest first.
    op.create_index("ix_stored_responses_created", "stored_responses", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_stored_responses_created", "stored_responses")
    op.drop_table("stored_responses")
