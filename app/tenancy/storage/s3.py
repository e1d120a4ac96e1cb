"""Adapter versions in an S3-compatible object store (AWS S3, MinIO, Ceph RGW, moto).

Layout under ``s3://<bucket>/<prefix>``, content-addressed by the content digest
(:func:`app.tenancy.adapters.content_sha256`)::

    <prefix>/sha256/<digest>/<file>      each file of the adapter, as validated
    <prefix>/sha256/<digest>.json        its manifest (:mod:`.manifest`), written last
    <prefix>/versions/<name>@v<N>.json   {"name", "version", "sha256"}: which content a
                                         version is, written once the store committed it

An upload writes every file and then the manifest, so a reader that finds a manifest finds
complete content. Hosts read content through their :class:`~.cache.AdapterCache`, which
checks it against the manifest. Credentials, region and endpoint come from boto3's usual
sources: the ``AWS_*`` variables (``AWS_ENDPOINT_URL`` for a store other than AWS), the
shared config files, or an instance role.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from app.tenancy.base_model import BaseModelInfo
from app.tenancy.storage.base import AdapterStore
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.errors import (
    AdapterContentCorrupt,
    AdapterContentMissing,
    AdapterStorageUnavailable,
)
from app.tenancy.storage.manifest import Manifest, StoredFile, is_digest, short
from app.tenancy.validation import ValidatedAdapter

_MISSING = ("NoSuchKey", "404", "NotFound")
_CHUNK = 1 << 20
# Fail over to a 503 within seconds when the store is down rather than hold a request.
_CLIENT_CONFIG = Config(
    connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}
)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"{url!r} is not an s3://bucket/prefix URL")
        return cls(parts.netloc, parts.path.strip("/"))

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def content_key(self, digest: str, name: str) -> str:
        return self.key(f"sha256/{digest}/{name}")

    def manifest_key(self, digest: str) -> str:
        return self.key(f"sha256/{digest}.json")

    def version_key(self, engine_name: str) -> str:
        return self.key(f"versions/{engine_name}.json")


def s3_client() -> Any:
    """A client configured the standard way (``AWS_*`` variables, config files, roles), as
    they are now: a session of its own, with the process's one loader of botocore's data."""
    session = botocore.session.get_session()
    session.register_component("data_loader", _botocore_data())
    return boto3.session.Session(botocore_session=session).client("s3", config=_CLIENT_CONFIG)


@functools.cache
def _botocore_data() -> botocore.loaders.Loader:
    """botocore's service models and endpoints, parsed once per process: a session's own
    loader parses their JSON again for each client, several times the cost of the rest."""
    return botocore.loaders.create_loader()


class S3Content:
    """Content in a bucket: the uploads of :class:`S3AdapterStore` and the source an
    :class:`AdapterCache` downloads from."""

    def __init__(self, location: S3Location, client: Any = None) -> None:
        self.location = location
        self.client = client if client is not None else s3_client()

    def has(self, digest: str) -> bool:
        """Whether complete content (its manifest) is stored for ``digest``."""
        try:
            self.client.head_object(
                Bucket=self.location.bucket, Key=self.location.manifest_key(digest)
            )
        except ClientError as exc:
            if _code(exc) in _MISSING:
                return False
            raise _unavailable(exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(exc) from exc
        return True

    def upload(self, directory: Path, manifest: Manifest) -> None:
        """Store the files of ``directory`` and then ``manifest``, which makes them visible."""
        bucket = self.location.bucket
        try:
            for file in manifest.files:
                with (directory / file.name).open("rb") as body:
                    self.client.put_object(
                        Bucket=bucket,
                        Key=self.location.content_key(manifest.digest, file.name),
                        Body=body,
                        ContentLength=file.size,
                    )
            self.client.put_object(
                Bucket=bucket,
                Key=self.location.manifest_key(manifest.digest),
                Body=manifest.to_json(),
                ContentType="application/json",
            )
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc) from exc

    def publish_version(self, name: str, version: int, digest: str) -> None:
        record = {"name": name, "version": version, "sha256": digest}
        try:
            self.client.put_object(
                Bucket=self.location.bucket,
                Key=self.location.version_key(f"{name}@v{version}"),
                Body=json.dumps(record).encode(),
                ContentType="application/json",
            )
        except (ClientError, BotoCoreError) as exc:
            raise _unavailable(exc) from exc

    def version_digest(self, engine_name: str) -> str:
        """The content digest of the version ``engine_name`` (``name@vN``)."""
        missing = f"No stored adapter version `{engine_name[:120]}`."
        if "/" in engine_name:
            raise AdapterContentMissing(missing)
        body = self._get(self.location.version_key(engine_name), missing)
        with body:
            raw = body.read()
        try:
            digest = json.loads(raw)["sha256"]
        except (ValueError, TypeError, KeyError) as exc:
            raise AdapterContentCorrupt(f"The record of `{engine_name}` is unreadable.") from exc
        if not isinstance(digest, str) or not is_digest(digest):
            raise AdapterContentCorrupt(f"The record of `{engine_name}` is unreadable.")
        return digest

    def manifest(self, digest: str) -> Manifest:
        raw = self._get(self.location.manifest_key(digest), f"No stored content {short(digest)}.")
        with raw:
            return Manifest.from_json(raw.read(), digest)

    def download(self, digest: str, file: StoredFile, target: Path) -> None:
        missing = f"{file.name} of {short(digest)} is missing from the adapter store."
        body = self._get(self.location.content_key(digest, file.name), missing)
        written = 0
        with body, target.open("wb") as out:
            try:
                for chunk in body.iter_chunks(_CHUNK):
                    written += len(chunk)
                    if written > file.size:  # never fill the disk with a wrong object
                        raise AdapterContentCorrupt(
                            f"{file.name} of {short(digest)} does not match its manifest."
                        )
                    out.write(chunk)
            except BotoCoreError as exc:
                raise _unavailable(exc) from exc

    def _get(self, key: str, missing: str) -> Any:
        try:
            return self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"]
        except ClientError as exc:
            if _code(exc) in _MISSING:
                raise AdapterContentMissing(missing) from exc
            raise _unavailable(exc) from exc
        except BotoCoreError as exc:
            raise _unavailable(exc) from exc


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _unavailable(exc: Exception) -> AdapterStorageUnavailable:
    detail = _code(exc) if isinstance(exc, ClientError) else type(exc).__name__
    return AdapterStorageUnavailable(f"The adapter store cannot be reached ({detail}); retry.")


class S3AdapterStore(AdapterStore):
    """Versions in an object store, with this host's copy in its cache (the engine in this
    process loads from disk). Identical content is uploaded once."""

    def __init__(
        self,
        root: Path,
        base: BaseModelInfo,
        *,
        max_rank: int,
        max_bytes: int,
        content: S3Content,
        cache: AdapterCache,
    ) -> None:
        super().__init__(root, base, max_rank=max_rank, max_bytes=max_bytes)
        self.content = content
        self.cache = cache

    def _keep(self, staging: Path, adapter: Path, checked: ValidatedAdapter) -> Path:
        manifest = Manifest.of_directory(adapter, checked.sha256)
        if not self.content.has(checked.sha256):
            self.content.upload(adapter, manifest)
        path = self.cache.admit(manifest, adapter)
        shutil.rmtree(staging, ignore_errors=True)
        return path

    def publish(self, name: str, version: int, digest: str) -> None:
        self.content.publish_version(name, version, digest)

    def local_copy(self, digest: str) -> Path:
        """This host's directory of ``digest``'s content, fetched from the store if the
        cache does not hold it (any more)."""
        return self.cache.fetch(digest, self.content)

    @contextmanager
    def held_copy(self, digest: str) -> Iterator[Path]:
        """:meth:`local_copy`, which the cache does not evict until the block ends."""
        with self.cache.open(digest, self.content) as path:
            yield path
