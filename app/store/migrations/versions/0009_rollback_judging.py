"""rollback judging: a grant's last change (when and how many), which its rollback rule judges
from and compares-and-sets on; whose doing each failed request was

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("grants", sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("grants", sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))
    # Existing grants are judged from the upgrade on, with the counts it starts keeping.
    grants = sa.table("grants", sa.column("changed_at", sa.DateTime(timezone=True)))
    op.execute(grants.update().values(changed_at=datetime.now(timezone.utc)))
    op.add_column("usage", sa.Column("fault", sa.String(length=16), nullable=True))
    # Before this, every failure was counted against its version.
    usage = sa.table("usage", sa.column("status", sa.String()), sa.column("fault", sa.String()))
    op.execute(usage.update().where(usage.c.status == "error").values(fault="version"))


def downgrade() -> None:
    op.drop_column("usage", "fault")
    op.drop_column("grants", "revision")
    op.drop_column("grants", "changed_at")
