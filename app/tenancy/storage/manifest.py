"""The manifest of one stored adapter content: its files with their sizes and sha256, and the
content digest (:func:`app.tenancy.adapters.content_sha256`) they add up to.

A storage writes the manifest after every file it names, so a reader that finds a manifest
finds complete content, and checks each file against it before using any.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from app.tenancy.adapters import content_sha256
from app.tenancy.storage.errors import AdapterContentCorrupt

MANIFEST_FORMAT = 1
_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def is_digest(text: str) -> bool:
    return _DIGEST.fullmatch(text) is not None


def short(digest: str) -> str:
    """How messages name content: enough of the digest to find it, or what was asked for."""
    return f"sha256:{digest[:12]}" if is_digest(digest) else repr(digest[:80])


@dataclass(frozen=True)
class StoredFile:
    name: str
    size: int
    sha256: str


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    digest: str
    files: tuple[StoredFile, ...]

    @property
    def size_bytes(self) -> int:
        return sum(file.size for file in self.files)

    @classmethod
    def of_directory(cls, directory: Path, digest: str) -> Manifest:
        """The manifest of a validated adapter directory (flat: validation allows no
        subdirectories) whose content digest is ``digest``."""
        files = tuple(
            StoredFile(path.name, path.stat().st_size, file_sha256(path))
            for path in sorted(directory.iterdir())
            if path.is_file()
        )
        return cls(digest, files)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "sha256": self.digest,
                "files": [
                    {"name": file.name, "size": file.size, "sha256": file.sha256}
                    for file in self.files
                ],
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes, digest: str) -> Manifest:
        """Parse the manifest stored for ``digest``; anything else is corrupt content."""
        try:
            data = json.loads(raw)
            files = tuple(
                StoredFile(str(item["name"]), int(item["size"]), str(item["sha256"]))
                for item in data["files"]
            )
            claimed = data["sha256"]
            known_format = data["format"] == MANIFEST_FORMAT
        except (ValueError, TypeError, KeyError) as exc:
            raise AdapterContentCorrupt(f"The manifest of {short(digest)} is unreadable.") from exc
        if not known_format or claimed != digest:
            raise AdapterContentCorrupt(f"The manifest of {short(digest)} names other content.")
        for file in files:
            if "/" in file.name or file.name in ("", ".", "..") or not is_digest(file.sha256):
                raise AdapterContentCorrupt(
                    f"The manifest of {short(digest)} names an invalid file."
                )
        return cls(digest, files)

    def verify(self, directory: Path) -> None:
        """Raise ``AdapterContentCorrupt`` unless ``directory`` holds exactly these files,
        each of its size and sha256, adding up to the digest."""
        present = sorted(path.name for path in directory.iterdir())
        if present != sorted(file.name for file in self.files):
            raise AdapterContentCorrupt(f"{short(self.digest)} does not hold the manifest's files.")
        for file in self.files:
            path = directory / file.name
            if path.stat().st_size != file.size or file_sha256(path) != file.sha256:
                raise AdapterContentCorrupt(
                    f"{file.name} of {short(self.digest)} does not match its manifest."
                )
        if content_sha256(directory) != self.digest:
            raise AdapterContentCorrupt(f"{short(self.digest)} does not match its digest.")
