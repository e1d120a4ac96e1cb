"""The store suite runs on every backend: SQLite, and a throwaway PostgreSQL
cluster started from the server binaries on the machine.

A test's store (``database_url``) is new and empty, for the tests that migrate it themselves;
one whose test opens ``sessions`` starts as a copy of a store already migrated (a file copy, or
PostgreSQL's ``CREATE DATABASE ... TEMPLATE``), which ``open_database`` then finds at the
latest revision: migrating each test's store anew took most of a store test's time."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import subprocess
import tempfile
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
from tests.support.servers import free_port


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return on_path


def _as_postgres_user(command: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server on a free loopback port, for this test session only."""
    data = Path(tempfile.mkdtemp(prefix="lgw-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    port = free_port()
    subprocess.run(
        _as_postgres_user(
            [
                _pg_bin("initdb"),
                "-D",
                str(data / "db"),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = [_pg_bin("pg_ctl"), "-D", str(data / "db"), "-l", str(data / "log"), "-o", options]
    subprocess.run(_as_postgres_user([*pg_ctl, "-w", "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_postgres_user([*pg_ctl, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


async def _create_database(server: str, name: str, template: str | None = None) -> None:
    import asyncpg

    connection = await asyncpg.connect(
        server.replace("postgresql+asyncpg", "postgresql") + "/postgres"
    )
    try:
        copied = "" if template is None else f' TEMPLATE "{template}"'
        await connection.execute(f'CREATE DATABASE "{name}"{copied}')
    finally:
        await connection.close()


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
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store of the backend: empty, or already migrated where the test opens
    ``sessions`` (which would otherwise migrate it)."""
    migrated = "sessions" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        if migrated:
            shutil.copyfile(migrated_store(), path)
        return f"sqlite+aiosqlite:///{path}"
    server = request.getfixturevalue("postgres_server")
    template = request.getfixturevalue("postgres_migrated_template") if migrated else None
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_create_database(server, name, template))
    return f"{server}/{name}"


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
