"""Leases on SQLite and PostgreSQL: one holder at a time; renewed by its holder; taken over
once expired (its holder died); released for the next at once."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.leases import Leases, new_holder_id

LONG = timedelta(minutes=5)


async def test_one_holder_at_a_time_until_it_expires_or_is_released(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    first, second = Leases(sessions, new_holder_id()), Leases(sessions, new_holder_id())
    assert first.holder != second.holder
    assert await first.take("batch:1", LONG)
    assert not await second.take("batch:1", LONG)
    assert await first.take("batch:1", LONG), "its holder renews it"
    assert await second.take("batch:2", LONG), "another name is another lease"
    await second.release("batch:1")  # not its own: nothing happens
    assert not await second.take("batch:1", LONG)
    await first.release("batch:1")
    assert await second.take("batch:1", LONG)
    assert not await first.take("batch:1", LONG)


async def test_an_expired_lease_is_taken_over(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    dead, alive = Leases(sessions, new_holder_id()), Leases(sessions, new_holder_id())
    assert await dead.take("batch:1", timedelta(milliseconds=50))
    await asyncio.sleep(0.1)
    assert await alive.take("batch:1", LONG)
    assert not await dead.take("batch:1", LONG), "its old holder must stop"


async def test_holders_racing_for_a_free_lease_get_it_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    holders = [Leases(sessions, new_holder_id()) for _ in range(5)]
    taken = await asyncio.gather(*(h.take("batch:race", LONG) for h in holders))
    assert sum(taken) == 1
