"""Replicas that start together on one new database all come up on the same schema."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.store.db import open_database

REPLICAS = 6


async def test_replicas_migrating_one_new_database_at_once_all_start(database_url: str) -> None:
    started = asyncio.Event()
    ready: list[str] = []

    async def replica() -> None:
        await started.wait()
        async with open_database(database_url) as sessions, sessions() as session:
            version = await session.scalar(text("SELECT version_num FROM alembic_version"))
            ready.append(str(version))

    tasks = [asyncio.create_task(replica()) for _ in range(REPLICAS)]
    started.set()
    await asyncio.gather(*tasks)
    assert len(ready) == REPLICAS
    assert len(set(ready)) == 1
