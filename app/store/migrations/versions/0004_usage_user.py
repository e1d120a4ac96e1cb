"""usage: the end user the client named (OpenAI's `user`)

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage", sa.Column("user", sa.String(length=256), nullable=True))


def downgrade() -> None:
    op.drop_column("usage", "user")
