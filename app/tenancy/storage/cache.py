"""A host's bounded cache of stored adapter content: ``<root>/sha256/<digest>/``.

Content appears there whole or not at all: it is downloaded into ``<root>/tmp/``, every file
and the content digest are checked against the manifest, and only then is the directory
renamed into place (one ``rename``, atomic on one filesystem). Per digest, ``flock`` on
``<root>/locks/<digest>.fetch`` makes processes and threads of one host that ask for the same
cold content at once wait for one download instead of each fetching it, and users share
``<root>/locks/<digest>.lock``, which an eviction must take alone.

The cache holds at most ``max_bytes`` of content: before a download, the least recently
used entries (by their directory's mtime, touched on every use) are removed until the new
content fits. An entry someone holds through :meth:`AdapterCache.open` is never removed,
nor one being downloaded. Content larger than the bound on its own is still fetched.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

from app.tenancy.storage.errors import AdapterContentMissing
from app.tenancy.storage.manifest import Manifest, StoredFile, is_digest, short

logger = logging.getLogger(__name__)


class ContentSource(Protocol):
    """Where content missing from the cache comes from (an object store)."""

    def manifest(self, digest: str) -> Manifest:
        """The complete manifest stored for ``digest``."""

    def download(self, digest: str, file: StoredFile, target: Path) -> None:
        """Write one file of ``digest``'s content to ``target``."""


class AdapterCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def path(self, digest: str) -> Path:
        return self.root / "sha256" / digest

    def fetch(self, digest: str, source: ContentSource) -> Path:
        """The local directory of ``digest``'s content, downloaded first if it is not here."""
        with self.open(digest, source) as path:
            return path

    @contextmanager
    def open(self, digest: str, source: ContentSource) -> Iterator[Path]:
        """Like :meth:`fetch`, and the entry is not evicted until the block ends."""
        if not is_digest(digest):
            raise AdapterContentMissing(f"{digest[:80]!r} is not a sha256 content digest.")
        final = self.path(digest)
        # Users share the entry's lock (an eviction needs it alone); whoever writes the entry
        # in holds its fetch lock. Two locks, never one upgraded: a user that holds the entry
        # (for as long as its process lives) must not keep another from fetching it.
        with self._flock(digest, "lock", fcntl.LOCK_SH):
            if not final.is_dir():
                with self._flock(digest, "fetch", fcntl.LOCK_EX):
                    if not final.is_dir():
                        self._download(source.manifest(digest), source)
            os.utime(final)
            yield final

    def admit(self, manifest: Manifest, directory: Path) -> Path:
        """Move ``directory``, content this host has just checked and stored, into the cache."""
        final = self.path(manifest.digest)
        with (
            self._flock(manifest.digest, "lock", fcntl.LOCK_SH),
            self._flock(manifest.digest, "fetch", fcntl.LOCK_EX),
        ):
            if not final.is_dir():
                self._make_room(manifest.size_bytes, keep=manifest.digest)
                temp = self._temp()
                shutil.move(directory, temp / "content")
                os.rename(temp / "content", final)
                shutil.rmtree(temp, ignore_errors=True)
            os.utime(final)
        return final

    def size_bytes(self) -> int:
        return sum(size for _, _, size in self._entries())

    def _download(self, manifest: Manifest, source: ContentSource) -> None:
        self._make_room(manifest.size_bytes, keep=manifest.digest)
        temp = self._temp()
        try:
            for file in manifest.files:
                source.download(manifest.digest, file, temp / file.name)
            manifest.verify(temp)
            os.rename(temp, self.path(manifest.digest))
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        logger.info("fetched %s (%d bytes)", short(manifest.digest), manifest.size_bytes)

    def _temp(self) -> Path:
        (self.root / "sha256").mkdir(parents=True, exist_ok=True)
        temp = self.root / "tmp" / uuid.uuid4().hex
        temp.mkdir(parents=True)
        return temp

    @contextmanager
    def _flock(self, digest: str, kind: str, operation: int) -> Iterator[None]:
        """``flock(operation)`` on ``<root>/locks/<digest>.<kind>`` until the block ends."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        # Lock files stay: removing one while another process waits on it would let two
        # processes each believe they hold the lock. Each open is its own lock holder, so
        # threads of one process exclude each other as processes do.
        fd = os.open(locks / f"{digest}.{kind}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, operation)
            yield
        finally:
            os.close(fd)

    def _entries(self) -> list[tuple[float, str, int]]:
        """(last use, digest, bytes) of every complete entry."""
        entries = []
        directory = self.root / "sha256"
        for entry in directory.iterdir() if directory.is_dir() else ():
            try:
                size = sum(file.stat().st_size for file in entry.iterdir())
                entries.append((entry.stat().st_mtime, entry.name, size))
            except FileNotFoundError:  # evicted meanwhile by another process
                continue
        return entries

    def _make_room(self, incoming: int, *, keep: str) -> None:
        entries = sorted(self._entries())
        total = incoming + sum(size for _, _, size in entries)
        for _, digest, size in entries:
            if total <= self.max_bytes:
                return
            if digest == keep:
                continue
            try:
                with self._flock(digest, "lock", fcntl.LOCK_EX | fcntl.LOCK_NB):
                    self._remove(digest)
            except BlockingIOError:  # in use, or being fetched: never removed under a user
                continue
            total -= size

    def _remove(self, digest: str) -> None:
        # Out of sha256/ in one rename, so no reader ever sees a directory half deleted.
        doomed = self._temp()
        with suppress(FileNotFoundError):  # another process removed it first
            os.rename(self.path(digest), doomed / "content")
        shutil.rmtree(doomed, ignore_errors=True)
