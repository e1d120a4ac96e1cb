"""The adapter storage interface: :class:`AdapterStore` validates and stages an adapter once;
each storage (``local.py``, ``s3.py``) only keeps what was accepted. It imports none of them.
"""

from __future__ import annotations

import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from app.tenancy.adapters import AdapterError
from app.tenancy.archive import extract_archive
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.validation import ValidatedAdapter, validate_adapter_dir

STORE_DIR = ".store"


class AdapterStore(ABC):
    """Accepted adapter versions: validated once, content-addressed (sha256), immutable.

    Adapters arrive as a directory under ``root`` or as an uploaded archive; both are
    validated in a staging directory under ``root`` before :meth:`_keep` hands the version to
    the storage. Nothing of a rejected adapter remains.
    """

    held_copy_waits: ClassVar[bool] = True
    """Whether entering :meth:`held_copy` may wait (a fetch, a lock): a caller on an event
    loop then enters it in a thread."""

    def __init__(self, root: Path, base: BaseModelInfo, *, max_rank: int, max_bytes: int) -> None:
        self.root = root
        self._base = base
        self._max_rank = max_rank
        self._max_bytes = max_bytes

    def _staging(self) -> Path:
        staging = self.root / STORE_DIR / f".incoming-{uuid.uuid4().hex}"
        staging.parent.mkdir(parents=True, exist_ok=True)
        return staging

    @abstractmethod
    def _keep(self, staging: Path, adapter: Path, checked: ValidatedAdapter) -> Path:
        """Store the validated ``adapter`` (inside ``staging``, which the store removes); the
        path the engine loads the version from."""

    @abstractmethod
    def publish(self, name: str, version: int, digest: str) -> None:
        """Record, where hosts without the database look, that version ``version`` of
        ``name`` is the content ``digest``; called once the store has committed it."""

    @abstractmethod
    def local_copy(self, digest: str) -> Path:
        """This host's directory of the stored content ``digest``, fetched first where the
        storage keeps it elsewhere. ``AdapterContentMissing`` when nothing holds it; a
        fetch may also raise the other errors of :mod:`app.tenancy.storage.errors`."""

    @contextmanager
    def held_copy(self, digest: str) -> Iterator[Path]:
        """:meth:`local_copy`, kept in place until the block ends (an engine in this process
        loads it from disk while a request runs). Nothing evicts a directory's content."""
        yield self.local_copy(digest)

    def _checked(self, directory: Path) -> ValidatedAdapter:
        return validate_adapter_dir(
            directory, self._base, max_rank=self._max_rank, max_bytes=self._max_bytes
        )

    def from_path(self, relative: str) -> tuple[ValidatedAdapter, Path]:
        """Validate a directory under the root and copy it into the store."""
        if not relative.isprintable():
            raise AdapterError("the path must not contain control characters")
        root = self.root.resolve()
        try:
            source = (root / relative).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long...
            raise AdapterError(f"path {relative!r} cannot be resolved") from exc
        if Path(relative).is_absolute() or not source.is_relative_to(root):
            raise AdapterError(f"path {relative!r} must be relative to the adapter root")
        if source.is_relative_to(root / STORE_DIR):
            raise AdapterError(f"path {relative!r} points into the adapter store")
        if not source.is_dir():
            raise AdapterError(f"no adapter directory at {relative!r}")
        checked = self._checked(source)
        staging = self._staging()
        try:
            shutil.copytree(source, staging, symlinks=True)
            if self._checked(staging).sha256 != checked.sha256:
                raise AdapterError(f"{relative!r} changed while it was being registered")
            return checked, self._keep(staging, staging, checked)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def from_archive(self, archive: Path, filename: str) -> tuple[ValidatedAdapter, Path]:
        """Unpack and validate an uploaded archive; nothing remains if it is rejected."""
        staging = self._staging()
        try:
            adapter = extract_archive(archive, filename, staging, max_bytes=self._max_bytes)
            checked = self._checked(adapter)
            return checked, self._keep(staging, adapter, checked)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
