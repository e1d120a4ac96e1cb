"""A transaction written as one synchronous function: committed when it returns, rolled back
when it raises; on a SQLite file, run whole on a thread of its own (one wait on the event
loop); the usage ledger's flush is one."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.tables import UsageRow
from app.store.transactions import transactions
from app.usage.ledger import UsageLedger, UsageRecord
from tests.support.usage import record

AT = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


def usage(n: int) -> UsageRecord:
    return record(n, model="notes", key="key", day=AT, prompt=3, completion=2)


async def counted(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(UsageRow)) or 0)


async def test_committed_when_the_work_returns_rolled_back_when_it_raises(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    runner = transactions(sessions, "test-writer")
    table = UsageRow.__table__

    def write(connection: Connection, n: int, fail: bool = False) -> str:
        written = usage(n)
        connection.execute(insert(table), [written.as_dict()])
        if fail:
            raise RuntimeError("the work failed after its insert")
        return written.request_id

    try:
        assert await runner.run(lambda c: write(c, 1)) == "r1"
        with pytest.raises(RuntimeError):
            await runner.run(lambda c: write(c, 2, fail=True))
        assert await counted(sessions) == 1
        await runner.close()
        assert await runner.run(lambda c: write(c, 3)) == "r3"  # opened again
        assert await counted(sessions) == 2
    finally:
        await runner.close()


async def test_a_ledger_flush_is_one_call_to_a_thread_of_its_own_on_sqlite(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    on_sqlite = sessions.kw["bind"].dialect.name == "sqlite"
    ledger = UsageLedger(sessions)
    threads: list[str] = []

    def sent(*_: Any) -> None:
        threads.append(threading.current_thread().name)

    event.listen(Engine, "before_cursor_execute", sent)
    try:
        ledger.record(usage(1))
        ledger.record(usage(2))
        assert await ledger.flush() == 2
    finally:
        event.remove(Engine, "before_cursor_execute", sent)
        await ledger.close()
    assert await counted(sessions) == 2
    if on_sqlite:
        # The records and the versions' counts: every statement on the ledger's own thread,
        # in one call (through the shared sessions, aiosqlite's thread took each apart).
        assert len(threads) >= 2
        assert {name.split("_")[0] for name in threads} == {"usage-writer"}
