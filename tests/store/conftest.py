"""The store suite runs on every backend: SQLite, and a throwaway PostgreSQL
cluster started from the server binaries on the machine.

A test's store (``database_url``) is new and empty, for the tests that migrate it themselves;
one whose test opens ``sessions`` starts as a copy of a store already migrated (a file copy, or
PostgreSQL's ``CREATE DATABASE ... TEMPLATE``), which ``open_database`` then finds at the
latest revision: migrating each test's store anew took most of a store test's time."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin.service import AdminService
from app.settings import EMBEDDED_MODEL_DIR
from app.store.db import open_database
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage import LocalAdapterStore
from tests.support.harness import migrated_store
from tests.support.postgres import PostgresCluster


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server on a free loopback port, for this test session only."""
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster.server_url
    finally:
        cluster.remove()


async def _execute(server: str, statement: str) -> None:
    """One statement on ``server``'s maintenance database."""
    import asyncpg

    connection = await asyncpg.connect(
        server.replace("postgresql+asyncpg", "postgresql") + "/postgres"
    )
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _create_database(server: str, name: str, template: str | None = None) -> None:
    copied = "" if template is None else f' TEMPLATE "{template}"'
    await _execute(server, f'CREATE DATABASE "{name}"{copied}')


MIGRATED_TEMPLATE = "migrated_template"


@pytest.fixture(scope="session")
def postgres_migrated_template(postgres_server: str) -> str:
    """A database of ``postgres_server`` migrated to the latest revision and left unopened,
    for ``CREATE DATABASE ... TEMPLATE``."""

    async def create() -> None:
        await _create_database(postgres_server, MIGRATED_TEMPLATE)
        async with open_database(f"{postgres_server}/{MIGRATED_TEMPLATE}"):
            pass

    asyncio.run(create())
    return MIGRATED_TEMPLATE


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new store of the backend: empty, or already migrated where the test opens
    ``sessions`` (which would otherwise migrate it). A PostgreSQL one is dropped after the
    test, so that the cluster (in memory where it can be) holds a few databases, not all."""
    migrated = "sessions" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        if migrated:
            shutil.copyfile(migrated_store(), path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    server = request.getfixturevalue("postgres_server")
    template = request.getfixturevalue("postgres_migrated_template") if migrated else None
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_create_database(server, name, template))
    yield f"{server}/{name}"
    # FORCE: a connection the test left open is closed, not a reason to keep the database.
    asyncio.run(_execute(server, f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def base_model() -> BaseModelInfo:
    return BaseModelInfo.from_model_dir(EMBEDDED_MODEL_DIR)


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    async with open_database(database_url) as sessions:
        yield sessions


@pytest.fixture
def changes() -> list[int]:
    return []


@pytest.fixture
def admin(
    sessions: async_sessionmaker[AsyncSession],
    base_model: BaseModelInfo,
    tmp_path: Path,
    changes: list[int],
) -> AdminService:
    async def changed() -> None:
        changes.append(1)

    storage = LocalAdapterStore(tmp_path / "adapters", base_model, max_rank=32, max_bytes=64 << 20)
    return AdminService(sessions, storage, on_change=changed)
