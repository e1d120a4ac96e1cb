"""Alembic environment: always run on a connection handed over by ``app.store.db``."""

from __future__ import annotations

from alembic import context

from app.store.tables import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # SQLite alters tables by copying them
)
with context.begin_transaction():
    context.run_migrations()
