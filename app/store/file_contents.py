"""The bytes of the Files API's files, where adapter versions are kept: a local directory
(``<adapter_root>/.store/files/``) on one host, or the adapters' object store
(``s3://<bucket>/<prefix>/files/``) in scale-out, so that every replica reads every file.

A file arrives whole in a local file (an upload spooled to disk, a batch's results written
out) and is put under its id; it is read back in chunks, never whole in memory. Every call
blocks: the async callers run them on a thread.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from app.errors import NotFoundError
from app.settings import Settings
from app.tenancy.storage import STORE_DIR
from app.tenancy.storage.errors import AdapterStorageUnavailable
from app.tenancy.storage.s3 import S3Location, s3_client

CHUNK = 1 << 20
_FILE_ID = re.compile(r"file-[0-9a-f]{32}")
_MISSING = ("NoSuchKey", "404", "NotFound")


class FileContentMissing(NotFoundError):
    code = "file_content_missing"


def _checked(file_id: str) -> str:
    """``file_id``, which is only ever one the gateway made: never a path."""
    if _FILE_ID.fullmatch(file_id) is None:
        raise FileContentMissing(f"No stored content for file {file_id[:80]!r}.")
    return file_id


class FileContents(ABC):
    @abstractmethod
    def put(self, file_id: str, source: Path) -> None:
        """Keep the local file ``source`` (which this call consumes) as ``file_id``'s bytes."""

    @abstractmethod
    def chunks(self, file_id: str) -> Iterator[bytes]:
        """``file_id``'s bytes, in chunks; :class:`FileContentMissing` if none are kept."""

    @abstractmethod
    def delete(self, file_id: str) -> None:
        """Remove ``file_id``'s bytes; nothing if none are kept."""

    @contextlib.contextmanager
    def local_copy(self, file_id: str, scratch: Path) -> Iterator[Path]:
        """A local file of ``file_id``'s bytes (a copy in ``scratch`` where the storage is
        elsewhere), until the block ends."""
        scratch.mkdir(parents=True, exist_ok=True)
        path = scratch / f"{_checked(file_id)}.copy"
        try:
            with path.open("wb") as out:
                for chunk in self.chunks(file_id):
                    out.write(chunk)
            yield path
        finally:
            path.unlink(missing_ok=True)


class LocalFileContents(FileContents):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, file_id: str) -> Path:
        return self.root / _checked(file_id)

    def put(self, file_id: str, source: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # A rename where the spool shares the filesystem: the bytes are never copied.
        shutil.move(source, self._path(file_id))

    def chunks(self, file_id: str) -> Iterator[bytes]:
        try:
            handle = self._path(file_id).open("rb")
        except FileNotFoundError as exc:
            raise FileContentMissing(f"No stored content for file {file_id}.") from exc
        with handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    @contextlib.contextmanager
    def local_copy(self, file_id: str, scratch: Path) -> Iterator[Path]:
        path = self._path(file_id)
        if not path.is_file():
            raise FileContentMissing(f"No stored content for file {file_id}.")
        yield path

    def delete(self, file_id: str) -> None:
        self._path(file_id).unlink(missing_ok=True)


class S3FileContents(FileContents):
    def __init__(self, location: S3Location, client: Any = None) -> None:
        self.location = location
        self.client = client if client is not None else s3_client()

    def _key(self, file_id: str) -> str:
        return self.location.key(f"files/{_checked(file_id)}")

    def put(self, file_id: str, source: Path) -> None:
        try:
            # boto3's managed transfer: a multipart upload, read from disk part by part.
            self.client.upload_file(str(source), self.location.bucket, self._key(file_id))
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc) from exc
        finally:
            source.unlink(missing_ok=True)

    def chunks(self, file_id: str) -> Iterator[bytes]:
        try:
            body = self.client.get_object(Bucket=self.location.bucket, Key=self._key(file_id))[
                "Body"
            ]
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in _MISSING:
                raise FileContentMissing(f"No stored content for file {file_id}.") from exc
            raise _unavailable(exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(exc) from exc
        with body:
            try:
                yield from body.iter_chunks(CHUNK)
            except BotoCoreError as exc:
                raise _unavailable(exc) from exc

    def delete(self, file_id: str) -> None:
        try:
            self.client.delete_object(Bucket=self.location.bucket, Key=self._key(file_id))
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc) from exc


def _unavailable(exc: Exception) -> AdapterStorageUnavailable:
    detail = type(exc).__name__
    return AdapterStorageUnavailable(f"The file store cannot be reached ({detail}); retry.")


def open_file_contents(settings: Settings) -> FileContents:
    """Where the settings keep adapter versions, files beside them."""
    if settings.adapter_store:
        return S3FileContents(S3Location.parse(settings.adapter_store))
    return LocalFileContents(settings.adapter_root / STORE_DIR / "files")


def spool_directory(settings: Settings) -> Path:
    """Where uploads are spooled and batch results written before they are stored: beside
    the local store, so that keeping one there is a rename."""
    return settings.adapter_root / STORE_DIR / "files-incoming"
