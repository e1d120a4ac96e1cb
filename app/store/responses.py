"""Stored responses of the Responses API, per tenant, in the shared store: every replica reads
the same ones. A tenant reads only its own: another tenant's id is not found, exactly as an
unknown one.

Saving is a group commit: the responses that finish while a write is under way are inserted
together, in the next transaction, by one statement, so many concurrent responses cost one
commit (one fsync on SQLite, one round trip on PostgreSQL) instead of one each. The
transaction goes through a connection of the store's own, with as few waits on the event
loop as each database allows (:mod:`app.store.batch_insert`), and each response's JSON is
serialised once, for its size and the row alike. Every write that adds, resizes or deletes a
row changes its tenant's stored bytes in its transaction (:mod:`app.store.storage_usage`).

A finished request does not wait for its write (:meth:`ResponseStore.keep`): on a busy
replica every wait is a turn of a loop that runs many streams, late by tens of milliseconds.
So a response may be read before its row is written. On its own replica it is read from
memory until then; on another, a read that misses an id young enough to be on its way (its
time is in it, :func:`app.ids.minted_at`) looks again until :data:`ARRIVAL_WAIT` has passed
since it was made. A write the store refuses because it is down is tried again for
:data:`WRITE_RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, Literal, TypeVar

from sqlalchemy import JSON, Column, Dialect, MetaData, Table, TypeDecorator, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.ids import minted_at
from app.store import storage_usage
from app.store.batch_insert import batch_inserter
from app.store.db import now, store_is_down
from app.store.tables import StoredResponseRow

logger = logging.getLogger(__name__)

Item = dict[str, Any]
_Found = TypeVar("_Found")


@dataclass(frozen=True)
class StoredResponse:
    id: str
    model: str
    adapter: str | None
    adapter_version: int | None
    body: dict[str, Any]
    input_items: list[Item]
    context: list[Item]

    @property
    def chain(self) -> list[Item]:
        """The chain's items up to and including this response's output: what a response
        continuing it follows."""
        return [*self.context, *self.input_items, *self.body.get("output", [])]


@dataclass(frozen=True)
class ItemPage:
    items: list[Item]
    has_more: bool


PURGE_BATCH = 500
"""Rows one purge transaction deletes: each holds the table's write lock only that long."""
SAVE_BATCH = 256
"""Most responses one save transaction inserts."""
KEPT_LINGER = 0.1
"""Seconds a write of kept responses alone waits for more to share its transaction: a commit
costs the loop a turn or two whatever its rows, and no caller waits for it."""
ARRIVAL_WAIT = 2.0
"""Seconds after a response's id was made during which a read (or delete) that misses it looks
again, as its replica's write may still be on its way: a group commit behind a loop busy with
many streams can take a second or more (``python -m tools.responses_store_bench`` times it)."""
ARRIVAL_POLL = 0.05
"""Seconds between those looks."""
WRITE_RETRY_SECONDS = 30.0
"""How long a kept response's write is tried again while the store is down."""
RETRY_PAUSE = 0.5
"""Seconds between those tries."""


@dataclass(eq=False)
class _Pending:
    row: dict[str, Any]
    response: StoredResponse
    written: asyncio.Future[None]
    kept: bool
    """Kept (:meth:`ResponseStore.keep`): no caller waits, so its write is retried, and
    a loss logged; else saved, its failure raised to its caller."""
    since: float = field(default_factory=time.monotonic)


class _SerialisedJSON(TypeDecorator[str]):
    """A JSON column written from JSON text already serialised: bound as it is, where the
    column's own type would serialise it again."""

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None


_SERIALISED = ("body", "input_items", "context")
_SAVED = Table(
    StoredResponseRow.__tablename__,
    MetaData(),
    *(
        Column(column.name, _SerialisedJSON() if column.name in _SERIALISED else column.type)
        for column in StoredResponseRow.__table__.columns
    ),
)
"""The stored responses' table as :meth:`ResponseStore.save` inserts into it."""


class ResponseStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], retention: timedelta) -> None:
        """Responses are kept for ``retention``: an older one is not found, and
        :meth:`purge` deletes it."""
        self._sessions = sessions
        self.retention = retention
        self._pending: list[_Pending] = []
        self._unwritten: dict[str, _Pending] = {}
        self._writer: asyncio.Task[None] | None = None
        self._inserter = batch_inserter(sessions, _SAVED, counted="size_bytes")

    def keep(self, tenant_uid: str, response: StoredResponse) -> None:
        """Store ``response`` for the tenant, without waiting for its write (the module's group
        commit): until it is written, this replica's reads find it in memory. A write the
        store refuses because it is down is tried again for :data:`WRITE_RETRY_SECONDS`; one
        it refuses for what is in it, or that long, is logged and lost."""
        self._enqueue(tenant_uid, response, kept=True)

    async def save(self, tenant_uid: str, response: StoredResponse) -> None:
        """Store ``response`` for the tenant; it is stored when this returns. It is inserted
        with the other responses saved meanwhile, in one transaction (the module's group
        commit); one the store refuses raises here alone."""
        # A caller that stops waiting does not stop the write: the others in its batch need it.
        await asyncio.shield(self._enqueue(tenant_uid, response, kept=False))

    async def written(self) -> None:
        """Wait for every response kept or saved so far to be written (or lost)."""
        while self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)

    def _enqueue(
        self, tenant_uid: str, response: StoredResponse, *, kept: bool
    ) -> asyncio.Future[None]:
        body, input_items, context = (
            json.dumps(part) for part in (response.body, response.input_items, response.context)
        )
        row = {
            "id": response.id,
            "tenant_uid": tenant_uid,
            "model": response.model,
            "adapter": response.adapter,
            "adapter_version": response.adapter_version,
            "body": body,
            "status": response.body["status"],
            "input_items": input_items,
            "context": context,
            "size_bytes": len(body) + len(input_items) + len(context),
            "created_at": now(),
        }
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(row, response, written, kept)
        self._pending.append(pending)
        self._unwritten.setdefault(response.id, pending)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_pending())
        return written

    async def _write_pending(self) -> None:
        try:
            while self._pending:
                if all(pending.kept for pending in self._pending):
                    # No caller waits: the responses that finish meanwhile share the commit.
                    await asyncio.sleep(KEPT_LINGER)
                batch, self._pending = self._pending[:SAVE_BATCH], self._pending[SAVE_BATCH:]
                await self._write(batch)
        finally:
            self._writer = None

    async def _write(self, batch: list[_Pending]) -> None:
        """Insert ``batch`` in one transaction; where the store refuses it for what is in it
        (not because it is down), each row again on its own, so that only the one refused
        fails. Where it is down, the kept rows go back to the queue's head, after a pause."""
        try:
            await self._inserter.insert([pending.row for pending in batch])
        except Exception as exc:
            down = store_is_down(exc)
            if len(batch) > 1 and not down:
                logger.warning("a batch of stored responses was refused; writing each alone")
                for pending in batch:
                    await self._write([pending])
                return
            retried = [
                pending
                for pending in batch
                if down and pending.kept and time.monotonic() - pending.since < WRITE_RETRY_SECONDS
            ]
            for pending in batch:
                if pending not in retried:
                    self._ended(pending, exc)
            if retried:
                await asyncio.sleep(RETRY_PAUSE)
                self._pending[:0] = retried
            return
        for pending in batch:
            self._ended(pending, None)

    def _ended(self, pending: _Pending, exc: Exception | None) -> None:
        if self._unwritten.get(pending.response.id) is pending:
            del self._unwritten[pending.response.id]
        if pending.written.done():
            return
        if exc is None:
            pending.written.set_result(None)
        elif pending.kept:
            logger.error("stored response %s was lost: %r", pending.response.id, exc)
            pending.written.set_result(None)
        else:
            pending.written.set_exception(exc)

    async def close(self) -> None:
        """Wait for the writes kept or saved, then close the store's own connection."""
        await self.written()
        await self._inserter.close()

    async def get(self, tenant_uid: str, response_id: str) -> StoredResponse | None:
        """The tenant's response ``response_id``; None where it has none of that id. One kept
        on this replica is found before it is written; a young one kept on another, once its
        write arrives (the module's :data:`ARRIVAL_WAIT`)."""
        unwritten = self._unwritten.get(response_id)
        if unwritten is not None and unwritten.row["tenant_uid"] == tenant_uid:
            return unwritten.response
        return await _once_arrived(response_id, partial(self._read, tenant_uid, response_id))

    async def _read(self, tenant_uid: str, response_id: str) -> StoredResponse | None:
        query = select(StoredResponseRow).where(
            StoredResponseRow.id == response_id,
            StoredResponseRow.tenant_uid == tenant_uid,
            StoredResponseRow.created_at >= now() - self.retention,
        )
        async with self._sessions() as session:
            row = (await session.execute(query)).scalar_one_or_none()
        if row is None:
            return None
        return StoredResponse(
            id=row.id,
            model=row.model,
            adapter=row.adapter,
            adapter_version=row.adapter_version,
            body=row.body,
            input_items=row.input_items,
            context=row.context,
        )

    async def finish(
        self,
        response_id: str,
        body: dict[str, Any],
        *,
        only_from: Sequence[str],
        answered_by: tuple[str | None, int | None] | None = None,
    ) -> bool:
        """Replace a background response's body (and its status, the body's) with ``body``,
        where its status is one of ``only_from``; ``answered_by``, the adapter and version that
        answered it (a chain continues on them). Whether it was replaced."""
        read = select(StoredResponseRow.body).where(
            StoredResponseRow.id == response_id, StoredResponseRow.status.in_(only_from)
        )
        async with self._sessions.begin() as session:
            before = (await session.execute(read)).scalar_one_or_none()
            if before is None:
                return False
            grown = len(json.dumps(body)) - len(json.dumps(before))
            values: dict[str, Any] = {
                "body": body,
                "status": body["status"],
                "size_bytes": StoredResponseRow.size_bytes + grown,
            }
            if answered_by is not None:
                values["adapter"], values["adapter_version"] = answered_by
            # Conditional again: another replica may have moved it since the read.
            query = (
                update(StoredResponseRow)
                .where(StoredResponseRow.id == response_id, StoredResponseRow.status.in_(only_from))
                .values(**values)
                .returning(StoredResponseRow.tenant_uid)
            )
            tenant_uid = (await session.execute(query)).scalar_one_or_none()
            if tenant_uid is None:
                return False
            await storage_usage.add(session, {tenant_uid: grown})
        return True

    async def status(self, response_id: str) -> str | None:
        """The status of response ``response_id``, whoever's it is; None where there is none."""
        query = select(StoredResponseRow.status).where(StoredResponseRow.id == response_id)
        async with self._sessions() as session:
            return (await session.execute(query)).scalar_one_or_none()

    async def body(self, response_id: str) -> dict[str, Any] | None:
        """The body of response ``response_id``, whoever's it is; None where there is none."""
        query = select(StoredResponseRow.body).where(StoredResponseRow.id == response_id)
        async with self._sessions() as session:
            return (await session.execute(query)).scalar_one_or_none()

    async def delete(self, tenant_uid: str, response_id: str) -> bool:
        """Delete the tenant's response ``response_id``; whether it had one. Responses that
        continued it keep their own context."""
        unwritten = self._unwritten.get(response_id)
        if unwritten is not None:
            await asyncio.wait({unwritten.written})
        return await _once_arrived(response_id, partial(self._delete, tenant_uid, response_id))

    async def _delete(self, tenant_uid: str, response_id: str) -> bool:
        query = (
            delete(StoredResponseRow)
            .where(StoredResponseRow.id == response_id, StoredResponseRow.tenant_uid == tenant_uid)
            .returning(StoredResponseRow.tenant_uid, -StoredResponseRow.size_bytes)
        )
        async with self._sessions.begin() as session:
            return bool(await storage_usage.deleted(session, query))

    async def purge(self, batch: int = PURGE_BATCH) -> int:
        """Delete the responses older than the retention, ``batch`` rows a transaction, oldest
        first; how many were deleted."""
        cutoff = now() - self.retention
        purged = 0
        while True:
            oldest = (
                select(StoredResponseRow.id)
                .where(StoredResponseRow.created_at < cutoff)
                .order_by(StoredResponseRow.created_at)
                .limit(batch)
            )
            async with self._sessions.begin() as session:
                ids = list((await session.scalars(oldest)).all())
                if ids:
                    await storage_usage.deleted(
                        session,
                        delete(StoredResponseRow)
                        .where(StoredResponseRow.id.in_(ids))
                        .returning(StoredResponseRow.tenant_uid, -StoredResponseRow.size_bytes),
                    )
            purged += len(ids)
            if len(ids) < batch:
                return purged


async def _once_arrived(response_id: str, look: Callable[[], Awaitable[_Found]]) -> _Found:
    """What ``look`` finds of response ``response_id``; where it finds nothing and the id is
    young enough that its write may be on its way from another replica, what it finds once
    it arrives, or nothing once :data:`ARRIVAL_WAIT` has passed since the id was made."""
    found = await look()
    made = minted_at(response_id)
    while not found and made is not None and 0 <= time.time() - made < ARRIVAL_WAIT:
        await asyncio.sleep(ARRIVAL_POLL)
        found = await look()
    return found


def page(
    items: Sequence[Item], *, after: str | None, limit: int, order: Literal["asc", "desc"]
) -> ItemPage | None:
    """One page of ``items``, in ``order``, of at most ``limit`` after the item ``after``;
    None where ``after`` is not one of them."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            return None
        start = ids.index(after) + 1
    chosen = ordered[start : start + limit]
    return ItemPage(items=chosen, has_more=start + limit < len(ordered))
