"""The Files API's service (docs/batches.md): an upload spooled to disk as it arrives (never
whole in memory) and counted, checked against the limits and the tenant's storage cap, then
kept in the file contents storage and recorded in the store; reads, deletes and the purge
of expired files."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

from app.errors import (
    BadRequestError,
    FileStorageLimitError,
    NotFoundError,
    RequestTooLargeError,
    StorageLimitError,
)
from app.store.file_contents import FileContents
from app.store.files import FilePage, FileStore, new_file_id
from app.store.tables import FileRow
from app.tenancy.tenants import Tenant

logger = logging.getLogger(__name__)


def not_found(file_id: str) -> NotFoundError:
    """The answer for a file the caller cannot read, whether unknown or another tenant's."""
    return NotFoundError(f"No such File object: {file_id[:100]}", param="file_id")


class Files:
    def __init__(
        self,
        store: FileStore,
        contents: FileContents,
        spool: Path,
        *,
        max_bytes: int,
        max_lines: int,
    ) -> None:
        self.store = store
        self.contents = contents
        self.spool = spool
        self.max_bytes = max_bytes
        self.max_lines = max_lines

    def spool_path(self) -> Path:
        """A fresh local file name for an upload or a batch's results, before it is kept."""
        self.spool.mkdir(parents=True, exist_ok=True)
        return self.spool / f"{uuid.uuid4().hex}.part"

    async def upload(
        self, tenant: Tenant, filename: str, purpose: str, chunks: AsyncIterator[bytes]
    ) -> FileRow:
        """Keep the bytes of ``chunks`` as a new file of the tenant. Refused, with nothing
        kept: past ``max_bytes`` (413, as soon as it passes), past ``max_lines`` (400), or
        past the tenant's storage cap (413 naming ``storage_bytes``; checked before the bytes
        are stored, and again, exactly, as the file is recorded)."""
        path = self.spool_path()
        try:
            size = await self._spooled(chunks, path)
            await self.check_room(tenant, size)
            file_id = new_file_id()
            await asyncio.to_thread(self.contents.put, file_id, path)
            try:
                return await self.store.add_within_cap(
                    tenant.id, tenant.uid, file_id, purpose=purpose, filename=filename, size=size
                )
            except BaseException:
                await asyncio.to_thread(self.contents.delete, file_id)
                raise
        except StorageLimitError as full:
            raise FileStorageLimitError(full.cap) from None
        finally:
            path.unlink(missing_ok=True)

    async def _spooled(self, chunks: AsyncIterator[bytes], path: Path) -> int:
        size = lines = 0
        last = b"\n"
        with path.open("wb") as out:
            async for chunk in chunks:
                if not chunk:
                    continue
                size += len(chunk)
                if size > self.max_bytes:
                    raise RequestTooLargeError(
                        self.max_bytes, what="The file", param="file", setting="max_file_bytes"
                    )
                lines += chunk.count(b"\n")
                last = chunk[-1:]
                out.write(chunk)
        lines += last != b"\n"  # a last line without its newline
        if lines > self.max_lines:
            raise BadRequestError(
                f"The file has {lines} lines; a batch file may have at most {self.max_lines} "
                "(the gateway's `max_file_lines`).",
                param="file",
            )
        if size == 0:
            raise BadRequestError("The file is empty.", param="file")
        return size

    async def check_room(self, tenant: Tenant, size: int, *, max_age: float = 0.0) -> None:
        """Refuse (:class:`StorageLimitError`) ``size`` more bytes past the tenant's storage
        cap; ``size`` 0 asks whether anything more fits. A check before the work, not a
        claim: what is then recorded is checked again in its own transaction (an upload), or
        may pass the cap by its own size (a stored response, whose size is known only once it
        ran). With ``max_age``, a pass may rest on this replica's reading of the room up to
        that many seconds old, with no wait on the store; a refusal always rests on a fresh
        one."""
        room = self.store.storage_room_seen(tenant.id, tenant.uid, max_age) if max_age else None
        if room is None or not _fits(room, size):
            room = await self.store.storage_room(tenant.id, tenant.uid)
        if not _fits(room, size):
            raise StorageLimitError(room[0])

    async def get(self, tenant: Tenant, file_id: str) -> FileRow:
        row = await self.store.get(tenant.uid, file_id)
        if row is None:
            raise not_found(file_id)
        return row

    async def page(
        self,
        tenant: Tenant,
        *,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
        purpose: str | None,
    ) -> FilePage:
        found = await self.store.page(
            tenant.uid, after=after, limit=limit, order=order, purpose=purpose
        )
        if found is None:
            raise BadRequestError(f"No file with id '{after}'.", param="after")
        return found

    def chunks(self, row: FileRow) -> Iterator[bytes]:
        """The file's bytes, in chunks (blocking: iterate on a thread)."""
        return self.contents.chunks(row.id)

    async def delete(self, tenant: Tenant, file_id: str) -> None:
        """Delete the tenant's file: its record, then its bytes."""
        if not await self.store.delete(tenant.uid, file_id):
            raise not_found(file_id)
        await asyncio.to_thread(self.contents.delete, file_id)

    async def purge(self) -> int:
        """Delete the files past their expiry from storage, then from the store; how many."""
        purged = 0
        while ids := await self.store.expired():
            for file_id in ids:
                await asyncio.to_thread(self.contents.delete, file_id)
            await self.store.forget(ids)
            purged += len(ids)
        return purged


def _fits(room: tuple[int, int], size: int) -> bool:
    cap, used = room
    return used + size <= cap and (size > 0 or used < cap)
