"""The Files API's files, per tenant, in the shared store; their bytes are kept by
:mod:`app.store.file_contents`. A tenant reads only its own: another tenant's id is not
found, exactly as an unknown one. A file past its expiry is not found either, and
:meth:`FileStore.expired` hands it to the purge. Every write that adds or deletes a file's row
changes its tenant's stored bytes in its transaction (:mod:`app.store.storage_usage`), which
the storage cap reads."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from sqlalchemy import ColumnElement, ScalarSelect, and_, delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.errors import StorageLimitError
from app.store import storage_usage
from app.store.db import lock_tenant, now, reading
from app.store.tables import FileRow, QuotaRow, StorageUsageRow

PURGE_BATCH = 500


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class FilePage:
    files: list[FileRow]
    has_more: bool


class FileStore:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        retention: timedelta,
        default_storage_bytes: int,
    ) -> None:
        """Files are kept for ``retention``; a tenant whose quota sets no ``storage_bytes``
        may hold ``default_storage_bytes``."""
        self._sessions = sessions
        self.retention = retention
        self.default_storage_bytes = default_storage_bytes
        self._room_reads: dict[tuple[str, str], asyncio.Future[tuple[int, int]]] = {}
        self._room_seen: dict[tuple[str, str], tuple[float, tuple[int, int]]] = {}

    def row(
        self, tenant_uid: str, file_id: str, *, purpose: str, filename: str, size: int
    ) -> FileRow:
        """The record of a file whose bytes are stored, created now, to be added."""
        created = now()
        return FileRow(
            id=file_id,
            tenant_uid=tenant_uid,
            purpose=purpose,
            filename=filename,
            bytes=size,
            created_at=created,
            expires_at=created + self.retention,
        )

    async def add_within_cap(
        self,
        tenant_id: str,
        tenant_uid: str,
        file_id: str,
        *,
        purpose: str,
        filename: str,
        size: int,
    ) -> FileRow:
        """Record a file whose bytes are stored, where the tenant's storage has room for it;
        else :class:`StorageLimitError`, nothing recorded. Exact: the room is counted and the
        file recorded (and counted) in one transaction under the tenant's lock, so uploads at
        once never pass the cap together."""
        row = self.row(tenant_uid, file_id, purpose=purpose, filename=filename, size=size)
        async with self._sessions.begin() as session:
            await lock_tenant(session, tenant_uid)
            cap = await self._cap(session, tenant_id)
            if await self._used(session, tenant_uid) + size > cap:
                raise StorageLimitError(cap)
            session.add(row)
            await storage_usage.add(session, {tenant_uid: size})
        return row

    async def get(self, tenant_uid: str, file_id: str) -> FileRow | None:
        query = select(FileRow).where(
            FileRow.id == file_id, FileRow.tenant_uid == tenant_uid, FileRow.expires_at > now()
        )
        async with self._sessions() as session:
            return (await session.execute(query)).scalar_one_or_none()

    async def page(
        self,
        tenant_uid: str,
        *,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
        purpose: str | None,
    ) -> FilePage | None:
        """The tenant's files by creation time, at most ``limit`` after the file ``after``;
        None where ``after`` is not one of its files."""
        query = select(FileRow).where(FileRow.tenant_uid == tenant_uid, FileRow.expires_at > now())
        if purpose is not None:
            query = query.where(FileRow.purpose == purpose)
        newest_first = order == "desc"
        if after is not None:
            cursor = await self.get(tenant_uid, after)
            if cursor is None:
                return None
            at, ident = cursor.created_at, cursor.id
            same_moment = FileRow.created_at == at
            query = query.where(
                or_(FileRow.created_at < at, and_(same_moment, FileRow.id < ident))
                if newest_first
                else or_(FileRow.created_at > at, and_(same_moment, FileRow.id > ident))
            )
        ordering = (
            (FileRow.created_at.desc(), FileRow.id.desc())
            if newest_first
            else (FileRow.created_at.asc(), FileRow.id.asc())
        )
        async with self._sessions() as session:
            rows = list((await session.scalars(query.order_by(*ordering).limit(limit + 1))).all())
        return FilePage(files=rows[:limit], has_more=len(rows) > limit)

    async def delete(self, tenant_uid: str, file_id: str) -> bool:
        """Forget the tenant's file ``file_id`` (its bytes are the caller's to remove);
        whether it had one."""
        query = (
            delete(FileRow)
            .where(FileRow.id == file_id, FileRow.tenant_uid == tenant_uid)
            .returning(FileRow.tenant_uid, -FileRow.bytes)
        )
        async with self._sessions.begin() as session:
            return bool(await storage_usage.deleted(session, query))

    async def expired(self, batch: int = PURGE_BATCH) -> list[str]:
        """Up to ``batch`` ids of files past their expiry, oldest first."""
        query = (
            select(FileRow.id)
            .where(FileRow.expires_at <= now())
            .order_by(FileRow.expires_at)
            .limit(batch)
        )
        async with self._sessions() as session:
            return list((await session.scalars(query)).all())

    async def forget(self, file_ids: list[str]) -> None:
        """Delete the rows of ``file_ids`` (whose bytes are gone)."""
        query = (
            delete(FileRow)
            .where(FileRow.id.in_(file_ids))
            .returning(FileRow.tenant_uid, -FileRow.bytes)
        )
        async with self._sessions.begin() as session:
            await storage_usage.deleted(session, query)

    # -- the tenant's storage cap ----------------------------------------------------

    async def storage_used(self, tenant_uid: str) -> int:
        """What the tenant's files and stored responses hold, in bytes (expired ones count
        until they are purged): their running total, one row."""
        async with self._sessions() as session:
            return await self._used(session, tenant_uid)

    async def storage_room(self, tenant_id: str, tenant_uid: str) -> tuple[int, int]:
        """What the tenant's files and stored responses may hold together, and what they
        hold (:meth:`storage_used`), in bytes, read by one query of two rows that takes no
        write lock (on a request's path, and the console's). The tenant's checks at once
        share one query: one that starts while another's query is under way gets that query's
        answer, no older than the query (a check, not a claim: requests checked at once all
        pass it alike)."""
        # A caller that stops waiting does not stop the query: the others sharing it need it.
        return await asyncio.shield(self._room_read(tenant_id, tenant_uid))

    def storage_room_seen(
        self, tenant_id: str, tenant_uid: str, max_age: float
    ) -> tuple[int, int] | None:
        """The tenant's room as this replica last read it, if at most ``max_age`` seconds ago,
        without waiting; else None. One past half that age is read again in the background,
        so that a tenant's steady requests find a reading young enough."""
        key = (tenant_id, tenant_uid)
        seen = self._room_seen.get(key)
        if seen is None:
            return None
        read_at, room = seen
        age = time.monotonic() - read_at
        if age > max_age:
            return None
        if age > max_age / 2:
            self._room_read(tenant_id, tenant_uid)
        return room

    def _room_read(self, tenant_id: str, tenant_uid: str) -> asyncio.Future[tuple[int, int]]:
        """The tenant's room query under way, begun where none is."""
        key = (tenant_id, tenant_uid)
        read = self._room_reads.get(key)
        if read is None:
            read = asyncio.ensure_future(self._read_room(tenant_id, tenant_uid))
            self._room_reads[key] = read
            read.add_done_callback(lambda done: self._room_read_done(key, done))
        return read

    def _room_read_done(self, key: tuple[str, str], read: asyncio.Future[tuple[int, int]]) -> None:
        if self._room_reads.get(key) is read:
            del self._room_reads[key]
        if read.cancelled():
            return
        if read.exception() is None:  # its callers raise it; none left is no reason to log it
            self._room_seen[key] = (time.monotonic(), read.result())

    async def _read_room(self, tenant_id: str, tenant_uid: str) -> tuple[int, int]:
        query = select(self._cap_query(tenant_id), self._used_query(tenant_uid))
        async with reading(self._sessions) as session:
            cap, used = (await session.execute(query)).one()
        return (self.default_storage_bytes if cap is None else cap), int(used)

    async def _cap(self, session: AsyncSession, tenant_id: str) -> int:
        cap = (await session.execute(select(self._cap_query(tenant_id)))).scalar_one()
        return self.default_storage_bytes if cap is None else cap

    @classmethod
    async def _used(cls, session: AsyncSession, tenant_uid: str) -> int:
        return int((await session.execute(select(cls._used_query(tenant_uid)))).scalar_one())

    @staticmethod
    def _cap_query(tenant_id: str) -> ScalarSelect[int | None]:
        """The tenant's quota's storage cap; NULL where none is set."""
        return (
            select(QuotaRow.storage_bytes).where(QuotaRow.tenant_id == tenant_id).scalar_subquery()
        )

    @staticmethod
    def _used_query(tenant_uid: str) -> ColumnElement[int]:
        """The tenant's running total; 0 where it has never stored anything."""
        total = select(StorageUsageRow.bytes).where(StorageUsageRow.tenant_uid == tenant_uid)
        return func.coalesce(total.scalar_subquery(), 0)
