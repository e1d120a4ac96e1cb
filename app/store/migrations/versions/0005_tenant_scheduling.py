"""tenants: scheduling weight and priority class

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Server defaults: existing tenants get the defaults a new tenant gets.
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("weight", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(
            sa.Column(
                "priority", sa.String(length=16), nullable=False, server_default="interactive"
            )
        )


def downgrade() -> None:
    # Not in batch mode: SQLite's batch copy drops and recreates the table, which with foreign
    # keys on would cascade to every key and grant; SQLite >= 3.35 drops a column in place.
    op.drop_column("tenants", "priority")
    op.drop_column("tenants", "weight")
