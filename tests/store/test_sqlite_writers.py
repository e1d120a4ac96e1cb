"""Processes share one SQLite store (the server, and the CLI an operator runs beside it): two
writing at once, or one writing while another holds a long read, never fail with "database is
locked"."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import func, select, text

from app.store.db import open_database
from app.store.tables import UsageRow
from tests.support.harness import migrated_store

# Each transaction reads, then writes: the pattern of the admin service (check, then insert)
# that a deferred transaction cannot survive when another process writes in between.
WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from datetime import datetime, timezone
    from sqlalchemy import func, select
    from app.store.db import open_database
    from app.store.tables import UsageRow

    async def main(url, tag, count):
        now = datetime.now(timezone.utc)
        async with open_database(url) as sessions:
            for n in range(count):
                async with sessions.begin() as session:
                    await session.scalar(select(func.count(UsageRow.id)))
                    session.add(UsageRow(
                        request_id=f"{tag}-{n}", tenant_id="t", key_id="k", endpoint="e",
                        model="m", adapter=None, adapter_version=None, prompt_tokens=1,
                        completion_tokens=1, status="ok", latency_ms=1, started_at=now,
                        finished_at=now,
                    ))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)
WRITES = 150


def migrated(path: Path) -> str:
    """A store at ``path``, a copy of one migrated once per process."""
    shutil.copyfile(migrated_store(), path)
    return f"sqlite+aiosqlite:///{path}"


def start_writer(url: str, tag: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, url, tag, str(count)], stderr=subprocess.PIPE, text=True
    )


def test_two_processes_write_one_sqlite_store_at_once(tmp_path: Path) -> None:
    url = migrated(tmp_path / "store.db")
    writers = [start_writer(url, tag, WRITES) for tag in ("server", "cli")]
    for process in writers:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr

    async def check() -> tuple[int, str]:
        async with open_database(url) as sessions, sessions() as session:
            rows = await session.scalar(select(func.count(UsageRow.id)))
            mode = await session.scalar(text("PRAGMA journal_mode"))
            return int(rows or 0), str(mode)

    assert asyncio.run(check()) == (2 * WRITES, "wal")


def test_a_long_read_does_not_hold_up_a_writer(tmp_path: Path) -> None:
    """A usage report's read holds its snapshot until the writer has finished: the writer
    cannot have waited for it (without write-ahead logging it would wait out the busy
    timeout, then fail with "database is locked"), however long the writes take."""
    url = migrated(tmp_path / "store.db")
    report = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    report.execute("BEGIN")
    snapshot = report.execute("SELECT count(*) FROM usage").fetchall()  # held until COMMIT
    try:
        writer = start_writer(url, "server", 20)
        _, stderr = writer.communicate(timeout=300)  # bounds a hang only
        # Read inside the same transaction: the snapshot was held all along.
        assert report.execute("SELECT count(*) FROM usage").fetchall() == snapshot == [(0,)]
    finally:
        report.execute("COMMIT")
    assert writer.returncode == 0, stderr
    assert "database is locked" not in stderr
    assert report.execute("SELECT count(*) FROM usage").fetchall() == [(20,)]
    report.close()
