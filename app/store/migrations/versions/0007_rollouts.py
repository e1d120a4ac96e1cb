"""rollouts: grants split across versions (sticky per end user), shadowed, their rollback rule
and last rollback; usage rows say how each request went (finish reason, TTFT, inter-token
latency) and which were shadows

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Added in place (no batch copy): existing grants keep their one version, not sticky.
    op.add_column("grants", sa.Column("weights", sa.JSON(), nullable=True))
    op.add_column(
        "grants", sa.Column("sticky", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("grants", sa.Column("shadow", sa.JSON(), nullable=True))
    op.add_column("grants", sa.Column("rollback", sa.JSON(), nullable=True))
    op.add_column("grants", sa.Column("rolled_back", sa.JSON(), nullable=True))
    op.add_column("usage", sa.Column("finish_reason", sa.String(length=32), nullable=True))
    op.add_column("usage", sa.Column("ttft_ms", sa.Integer(), nullable=True))
    op.add_column("usage", sa.Column("itl_ms", sa.Float(), nullable=True))
    op.add_column(
        "usage", sa.Column("shadow", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    op.drop_column("usage", "shadow")
    op.drop_column("usage", "itl_ms")
    op.drop_column("usage", "ttft_ms")
    op.drop_column("usage", "finish_reason")
    op.drop_column("grants", "rolled_back")
    op.drop_column("grants", "rollback")
    op.drop_column("grants", "shadow")
    op.drop_column("grants", "sticky")
    op.drop_column("grants", "weights")
