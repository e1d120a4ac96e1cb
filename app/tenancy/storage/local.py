"""Adapter versions on this host's disk: the embedded default."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.tenancy.storage.base import STORE_DIR, AdapterStore
from app.tenancy.storage.errors import AdapterContentMissing
from app.tenancy.storage.manifest import is_digest, short
from app.tenancy.validation import ValidatedAdapter


class LocalAdapterStore(AdapterStore):
    """Versions on this host's disk, under ``<root>/.store/<sha256>/``."""

    held_copy_waits = False  # a copy is a directory here, looked up by a stat

    def _keep(self, staging: Path, adapter: Path, checked: ValidatedAdapter) -> Path:
        final = self.root / STORE_DIR / checked.sha256
        if not final.exists():  # identical content is stored once
            adapter.rename(final)
        shutil.rmtree(staging, ignore_errors=True)
        return final

    def publish(self, name: str, version: int, digest: str) -> None:
        """Nothing to do: on one host the store is the only index of versions."""

    def local_copy(self, digest: str) -> Path:
        path = self.root / STORE_DIR / digest
        if not is_digest(digest) or not path.is_dir():
            raise AdapterContentMissing(f"No stored content {short(digest)}.")
        return path
