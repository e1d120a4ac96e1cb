"""background_responses: a stored response's status, so that a background response's row can
move from queued or in progress to its end by one conditional write

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stored_responses") as table:
        table.add_column(
            sa.Column("status", sa.String(length=16), nullable=False, server_default="completed")
        )


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as table:
        table.drop_column("status")
