"""tenants: latency objectives of their own

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Server defaults: existing tenants keep their class's objectives, as a new tenant does.
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("slo_ttft_ms", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("slo_tpot_ms", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    # Not in batch mode, as 0005's downgrade: SQLite's batch copy would cascade to every key.
    op.drop_column("tenants", "slo_tpot_ms")
    op.drop_column("tenants", "slo_ttft_ms")
