"""Adapter versions on this host's disk: the embedded default."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.tenancy.storage.base import STORE_DIR, AdapterStore
from app.tenancy.validation import ValidatedAdapter


class LocalAdapterStore(AdapterStore):
    """Versions on this host's disk, under ``<root>/.store/<sha256>/``."""

    def _keep(self, staging: Path, adapter: Path, checked: ValidatedAdapter) -> Path:
        final = self.root / STORE_DIR / checked.sha256
        if not final.exists():  # identical content is stored once
            adapter.rename(final)
        shutil.rmtree(staging, ignore_errors=True)
        return final
