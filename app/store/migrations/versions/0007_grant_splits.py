"""grants: a weighted split of versions, sticky per end user, and the last rollback

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
    op.add_column("grants", sa.Column("rolled_back", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("grants", "rolled_back")
    op.drop_column("grants", "sticky")
    op.drop_column("grants", "weights")
