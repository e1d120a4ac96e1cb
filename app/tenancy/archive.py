"""Unpacking an uploaded adapter archive (.zip, .tar.gz), the security-critical part of an
upload: only regular files and directories with safe, unique names, bounded in count and
size, checked before anything is written; errors never show server paths."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import re
import shutil
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import IO

from app.tenancy.adapters import AdapterError

_SPECIAL_FILES = {
    stat.S_IFLNK: "symbolic link",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
}
_TAR_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}
# What corrupt archives raise from zipfile, tarfile and their decompressors (ValueError
# covers undecodable member names, NotImplementedError unsupported compression methods).
_UNPACK_ERRORS = (
    OSError,
    EOFError,
    ValueError,
    NotImplementedError,
    zlib.error,
    lzma.LZMAError,
    struct.error,
    zipfile.BadZipFile,
    tarfile.TarError,
)
_CHUNK = 1 << 20
# Central directory bytes allowed per member: its fixed 46 bytes plus a generous name, extra
# field and comment. zipfile parses (and keeps) the whole directory before any check can run.
_ZIP_DIRECTORY_BYTES_PER_MEMBER = 4096

# An archive member: name, declared size, "file", "directory" or what else it is, and an opener.
_Member = tuple[str, int, str, Callable[[], IO[bytes]]]


def extract_archive(
    archive: Path, filename: str, destination: Path, *, max_bytes: int, max_files: int = 64
) -> Path:
    """Unpack a .zip or .tar.gz/.tgz into the empty ``destination``; return the adapter dir.

    The type comes from ``filename`` and must agree with the magic bytes. Accepted: only
    regular files and directories with relative, ``..``-free, unique names, at most
    ``max_files`` members and ``max_bytes`` uncompressed, checked against every declared
    size before anything is written and against the bytes actually written. The adapter dir
    is ``destination``, or its only entry when that is a directory. On failure nothing is
    left: ``destination`` is removed if this call created it, else emptied.
    """
    lower = filename.lower()
    is_zip = lower.endswith(".zip")
    if is_zip:
        magic, label = b"PK\x03\x04", "a zip archive"
    elif lower.endswith((".tar.gz", ".tgz")):
        magic, label = b"\x1f\x8b", "a gzip-compressed tar archive"
    else:
        raise AdapterError(f"{filename!r} is not a .zip, .tar.gz or .tgz archive")
    with archive.open("rb") as file:
        if file.read(len(magic)) != magic:
            raise AdapterError(f"{filename!r} is not {label}, whatever its name says")
    created = not destination.exists()
    destination.mkdir(parents=True, exist_ok=True)
    if any(destination.iterdir()):
        raise AdapterError(f"cannot unpack {filename!r}: the destination is not empty")
    try:
        if is_zip:
            _check_zip_directory(archive, max_files)
        # Pass one checks every member before pass two writes any: tar headers sit among data.
        for target in (None, destination):
            _Unpacker(target, max_bytes, max_files).unpack(archive, is_zip=is_zip)
        entries = list(destination.iterdir())
        if not entries:
            raise AdapterError(f"{filename!r} is an empty archive")
        return entries[0] if len(entries) == 1 and entries[0].is_dir() else destination
    except BaseException as exc:
        shutil.rmtree(destination, ignore_errors=True)
        if not created:
            destination.mkdir()
        if isinstance(exc, _UNPACK_ERRORS) and not isinstance(exc, AdapterError):
            # OS errors name the files they failed on: server paths, never shown.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            reason = _without_paths(reason, archive, destination)
            raise AdapterError(f"{filename!r} could not be unpacked: {reason}") from exc
        raise


def _without_paths(text: str, *paths: Path) -> str:
    for path in paths:
        for form in {str(path.resolve()), str(path)}:
            text = text.replace(form, "<upload>")
    return text


def _check_zip_directory(archive: Path, max_files: int) -> None:
    """Refuse a zip whose central directory is too large before zipfile reads all of it.

    zipfile parses every entry into memory when it opens an archive (about 600 bytes per
    entry): a 1 GiB upload of empty entries would take gigabytes and a minute. This reads the
    end-of-central-directory record (zip64's when present) where zipfile does.
    """
    with archive.open("rb") as file:
        size = file.seek(0, os.SEEK_END)
        # zipfile's search: a record without comment at the very end, else the last one.
        tail_start = max(size - 22 - 0xFFFF, 0)
        file.seek(tail_start)
        tail = file.read()
        at = len(tail) - 22
        if not (at >= 0 and tail[at:].startswith(b"PK\x05\x06") and tail.endswith(b"\0\0")):
            at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            raise zipfile.BadZipFile("no end-of-central-directory record")
        entries, directory_size = struct.unpack_from("<10xHI", tail, at)
        locator = tail_start + at - 20
        if locator >= 56:
            file.seek(locator)
            if file.read(4) == b"PK\x06\x07":
                file.seek(locator - 56)
                record = file.read(56)
                if record[:4] == b"PK\x06\x06":
                    entries, directory_size = struct.unpack_from("<32xQQ", record)
    if entries > max_files or directory_size > max_files * _ZIP_DIRECTORY_BYTES_PER_MEMBER:
        raise AdapterError(f"the archive has more than {max_files} members")


class _Unpacker:
    """One pass over an archive: checks members, and writes them if ``target`` is set."""

    def __init__(self, target: Path | None, max_bytes: int, max_files: int) -> None:
        self.target, self.max_bytes, self.max_files = target, max_bytes, max_files
        self.seen: set[tuple[str, ...]] = set()
        self.files: set[tuple[str, ...]] = set()
        self.directories: set[tuple[str, ...]] = set()
        self.declared = self.written = 0

    def unpack(self, archive: Path, *, is_zip: bool) -> None:
        if is_zip:
            with zipfile.ZipFile(archive) as zipped:
                self._members(_zip_members(zipped))
            return
        # Caps decompressed bytes, headers included, which bounds the cost of a gzip bomb.
        limit = self.max_bytes + (self.max_files + 8) * 3 * tarfile.BLOCKSIZE
        limit += 2 * tarfile.RECORDSIZE
        with (
            gzip.open(archive, "rb") as raw,
            tarfile.open(fileobj=_Capped(raw, limit, self._too_big), mode="r|") as tar,
        ):
            self._members(_tar_members(tar))

    def _too_big(self) -> AdapterError:
        return AdapterError(f"the archive unpacks to more than {self.max_bytes} bytes")

    def _members(self, members: Iterator[_Member]) -> None:
        for count, (name, size, kind, open_member) in enumerate(members, 1):
            if count > self.max_files:
                raise AdapterError(f"the archive has more than {self.max_files} members")
            if kind not in ("file", "directory"):
                article = "an" if kind[0] in "aeiou" else "a"
                raise AdapterError(
                    f"archive member {name!r} is {article} {kind}, not a file or directory"
                )
            if "\\" in name or "\0" in name:
                raise AdapterError(f"archive member {name!r}: backslashes and NULs are not allowed")
            if not name.isprintable():
                raise AdapterError(f"archive member {name!r}: names must be printable UTF-8 text")
            if name.startswith("/") or re.match(r"[A-Za-z]:", name):
                raise AdapterError(f"archive member {name!r} has an absolute path")
            parts = tuple(part for part in name.split("/") if part not in ("", "."))
            if ".." in parts:
                raise AdapterError(f"archive member {name!r} points outside the archive ('..')")
            if not parts and kind == "file":
                raise AdapterError(f"archive member {name!r} has no file name")
            if parts and parts in self.seen:
                raise AdapterError(f"archive member {name!r} appears more than once")
            if any(len(part.encode()) > 255 for part in parts):
                raise AdapterError(f"archive member {name!r} has a name over 255 bytes")
            self._place(name, parts, kind)
            self.declared += size
            if size < 0 or self.declared > self.max_bytes:
                raise self._too_big()
            if self.target is not None and kind == "directory":
                self.target.joinpath(*parts).mkdir(parents=True, exist_ok=True)
            elif self.target is not None:
                with open_member() as source:
                    self._write(source, self.target.joinpath(*parts), size)

    def _place(self, name: str, parts: tuple[str, ...], kind: str) -> None:
        """Refuse a name that is a file and a directory at once (``a`` and ``a/b``)."""
        parents = [parts[:end] for end in range(1, len(parts))]
        for parent in parents:
            if parent in self.files:
                raise AdapterError(
                    f"archive member {name!r} is inside {'/'.join(parent)!r}, which is a file"
                )
        if kind == "file" and parts in self.directories:
            raise AdapterError(f"archive member {name!r} is both a file and a directory")
        self.seen.add(parts)
        self.directories.update(parents)
        (self.files if kind == "file" else self.directories).add(parts)

    def _write(self, source: IO[bytes], path: Path, declared: int) -> None:
        # Headers can lie about sizes, so the bytes actually written are what count.
        path.parent.mkdir(parents=True, exist_ok=True)
        start = self.written
        with path.open("xb") as out:
            while chunk := source.read(_CHUNK):
                self.written += len(chunk)
                if self.written > self.max_bytes:
                    raise self._too_big()
                out.write(chunk)
        if self.written - start != declared:
            raise AdapterError(f"archive member {path.name!r} does not match its declared size")


def _zip_members(zipped: zipfile.ZipFile) -> Iterator[_Member]:
    for info in zipped.infolist():
        mode = stat.S_IFMT(info.external_attr >> 16)
        kind = _SPECIAL_FILES.get(mode) or ("directory" if info.is_dir() else "file")
        kind = "encrypted file" if info.flag_bits & 0x1 else kind
        yield info.filename, info.file_size, kind, partial(zipped.open, info)


def _tar_members(tar: tarfile.TarFile) -> Iterator[_Member]:
    for member in tar:
        kind = "directory" if member.isdir() else _TAR_KINDS.get(member.type, "special file")
        if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            kind = "file"
        yield member.name, member.size, kind, partial(_extracted, tar, member)


def _extracted(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    source = tar.extractfile(member)
    if source is None:
        raise AdapterError(f"archive member {member.name!r} has no data")
    return source


class _Capped(io.RawIOBase):
    """A read-only stream that raises ``error()`` once more than ``limit`` bytes were read."""

    def __init__(self, raw: io.BufferedIOBase, limit: int, error: Callable[[], Exception]) -> None:
        super().__init__()
        self._raw, self._left, self._error = raw, limit, error

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        data = self._raw.read(self._left + 1 if size < 0 else min(size, self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise self._error()
        return data
