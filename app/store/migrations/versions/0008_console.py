"""console: admin console sessions, and quota refusals per tenant and minute

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refusals",
        sa.Column("tenant_uid", sa.String(length=32), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("limit", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_uid", "minute", "limit"),
    )
    op.create_index("ix_refusals_minute", "refusals", ["minute"])
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("admin_token_sha256", sa.String(length=64), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_by", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_console_sessions_admin_token_sha256", "console_sessions", ["admin_token_sha256"]
    )


def downgrade() -> None:
    op.drop_index("ix_console_sessions_admin_token_sha256", "console_sessions")
    op.drop_table("console_sessions")
    op.drop_index("ix_refusals_minute", "refusals")
    op.drop_table("refusals")
