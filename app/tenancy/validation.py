"""Checks an uploaded LoRA adapter must pass before anything of it is stored.

Only metadata is read: JSON, archive headers and safetensors headers; tensor data is never
loaded and nothing is unpickled. Each rejection is an ``AdapterError`` whose message is for
the admin who uploaded the adapter: it names files, tensors and modules, not server paths.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import math
import os
import re
import shutil
import stat
import struct
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import regex
from safetensors import SafetensorError, safe_open

from app.tenancy.adapters import CONFIG_FILE, WEIGHTS_FILE, AdapterError, content_sha256

ALLOWED_FILES = (CONFIG_FILE, WEIGHTS_FILE, "README.md", ".gitattributes")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
TENSOR_DTYPES = ("F16", "BF16", "F32")
_UNSERVED = {
    "use_dora": "DoRA adapters are not served",
    "modules_to_save": "only LoRA weights are served, not full copies of base model modules",
    "layers_to_transform": "every layer of each targeted module must be adapted",
    "rank_pattern": "every module must use the same rank",
    "alpha_pattern": "every module must use the same lora_alpha",
    "layer_replication": "base model layers cannot be replicated",
    "alora_invocation_tokens": "activated LoRA (aLoRA) is not served",
    "target_parameters": "only linear layers can be adapted, not raw parameters",
    "trainable_token_indices": "embedding rows cannot be trained",
}
_TENSOR_NAME = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<kind>[AB])\.weight")
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_NOT_LORA_TARGETS = ("embed", "lm_head", "wte", "wpe")
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
# A string target_modules is a regular expression run against every module name of the base
# model: it is compiled with `regex`, whose matcher can be stopped, and all its matches
# together get this many seconds, so a pattern that backtracks catastrophically is refused
# instead of holding a thread (and the GIL) for minutes.
TARGET_PATTERN_BUDGET_S = 0.5
MAX_TARGET_PATTERN_LENGTH = 1000
# Central directory bytes allowed per member: its fixed 46 bytes plus a generous name, extra
# field and comment. zipfile parses (and keeps) the whole directory before any check can run.
_ZIP_DIRECTORY_BYTES_PER_MEMBER = 4096

# An archive member: name, declared size, "file", "directory" or what else it is, and an opener.
_Member = tuple[str, int, str, Callable[[], IO[bytes]]]


@dataclass(frozen=True)
class BaseModelInfo:
    """The linear layers of the base model that adapters are checked against.

    ``linear_shapes`` maps each module suffix LoRA may target (``q_proj``) to
    ``(out_features, in_features)``. ``modules`` maps full module paths
    (``model.layers.0.self_attn.q_proj``) to shapes; when empty, tensors are matched by
    suffix and layer index only.
    """

    name_or_path: str
    linear_shapes: Mapping[str, tuple[int, int]]
    num_layers: int
    modules: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> BaseModelInfo:
        """Read a local HF model dir's config.json and safetensors headers (never tensors)."""
        try:
            config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            num_layers = int(config.get("text_config", config)["num_hidden_layers"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AdapterError(f"{model_dir}: unreadable base model config.json: {exc}") from exc
        modules: dict[str, tuple[int, int]] = {}
        for file in sorted(model_dir.glob("*.safetensors")):
            with safe_open(file, framework="np") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    shape = handle.get_slice(key).get_shape()
                    excluded = any(part in key for part in _NOT_LORA_TARGETS)
                    if key.endswith(".weight") and len(shape) == 2 and not excluded:
                        modules[key.removesuffix(".weight")] = (shape[0], shape[1])
        if not modules:
            raise AdapterError(f"{model_dir}: no linear layers found in *.safetensors")
        suffixes: dict[str, tuple[int, int]] = {}
        for path, shape in modules.items():
            suffixes.setdefault(path.rsplit(".", 1)[-1], shape)
        return cls(str(model_dir), suffixes, num_layers, modules)


@dataclass(frozen=True)
class ValidatedAdapter:
    """What validation learned about an adapter directory that may be stored as it is."""

    rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    size_bytes: int
    sha256: str


def validate_adapter_dir(
    directory: Path, base: BaseModelInfo, *, max_rank: int, max_bytes: int
) -> ValidatedAdapter:
    """Check a PEFT LoRA directory against ``base``; raise ``AdapterError`` at the first problem.

    Accepted: exactly adapter_config.json and adapter_model.safetensors (README.md and
    .gitattributes allowed), no links, at most ``max_bytes`` in all, a LORA config of rank
    at most ``max_rank`` without features this server does not serve, and only correctly
    shaped lora_A/lora_B pairs for linear layers of ``base`` that target_modules selects.
    ``target_modules`` of the result are the selected module suffixes, sorted.
    """
    size = _check_files(directory, max_bytes)
    config = _read_config(directory)
    rank, alpha = _check_hyperparameters(config, max_rank)
    claimed = config.get("base_model_name_or_path")
    if claimed and not _same_model(str(claimed), base.name_or_path):
        raise AdapterError(
            f"the adapter was trained for base model {claimed!r}, "
            f"but this server serves {_model_name(base.name_or_path)!r}"
        )
    select = _TargetSelector(config.get("target_modules"))
    targeted = _check_targets(select, list(base.modules) or list(base.linear_shapes), base)
    _check_tensors(directory / WEIGHTS_FILE, base, rank, select)
    suffixes = tuple(sorted({module.rsplit(".", 1)[-1] for module in targeted}))
    return ValidatedAdapter(rank, alpha, suffixes, size, content_sha256(directory))


def _check_files(directory: Path, max_bytes: int) -> int:
    if directory.is_symlink() or not directory.is_dir():
        raise AdapterError("the adapter is not a directory")
    links, pickles, unexpected, total = [], [], [], 0
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            info = Path(root, name).lstat()
            relative = Path(root, name).relative_to(directory).as_posix()
            if stat.S_ISLNK(info.st_mode):
                links.append(relative)
            elif name.lower().endswith(PICKLE_SUFFIXES):
                pickles.append(relative)
            elif relative not in ALLOWED_FILES or not stat.S_ISREG(info.st_mode):
                unexpected.append(relative)
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    if links:
        raise AdapterError(f"symbolic links are not accepted: {', '.join(sorted(links))}")
    if pickles:
        names = ", ".join(sorted(pickles))
        raise AdapterError(
            f"pickle-based weights are not accepted; convert to safetensors: {names}"
        )
    if unexpected:
        names, allowed = ", ".join(sorted(unexpected)), ", ".join(ALLOWED_FILES)
        raise AdapterError(f"unexpected files: {names} (only {allowed} are accepted)")
    if not (directory / WEIGHTS_FILE).is_file():
        raise AdapterError(f"{WEIGHTS_FILE} is missing (weights are accepted only as safetensors)")
    if total > max_bytes:
        raise AdapterError(f"the adapter is {total} bytes, over the limit of {max_bytes} bytes")
    return total


def _read_config(directory: Path) -> dict[str, Any]:
    if not (directory / CONFIG_FILE).is_file():
        raise AdapterError(f"{CONFIG_FILE} is missing")
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except OSError as exc:
        raise AdapterError(f"{CONFIG_FILE} is unreadable: {exc.strerror}") from exc
    except ValueError as exc:
        raise AdapterError(f"{CONFIG_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{CONFIG_FILE} must hold a JSON object")
    return config


def _check_hyperparameters(config: dict[str, Any], max_rank: int) -> tuple[int, float]:
    if (peft_type := config.get("peft_type")) != "LORA":
        raise AdapterError(f"peft_type is {peft_type!r}; only LORA adapters are served")
    rank = config.get("r")
    if rank is None:
        raise AdapterError("the LoRA rank (r) is missing")
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise AdapterError(f"the LoRA rank (r) must be an integer, not {rank!r}")
    if not 1 <= rank <= max_rank:
        raise AdapterError(f"the LoRA rank (r) is {rank}; it must be between 1 and {max_rank}")
    alpha = config.get("lora_alpha", 8)  # PEFT's default when the key is absent
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterError(f"lora_alpha must be a number, not {alpha!r}")
    if alpha <= 0:
        raise AdapterError(f"lora_alpha must be positive, not {alpha}")
    for key, reason in _UNSERVED.items():
        value = config.get(key)
        if value is not None and value is not False and value not in ([], {}):
            raise AdapterError(f"{key}={value!r} is not supported: {reason}")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"bias={config['bias']!r} is not supported: only 'none' is served")
    return rank, float(alpha)


def _model_name(name_or_path: str) -> str:
    return name_or_path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _same_model(claimed: str, ours: str) -> bool:
    """Equal, or the same final path component (HF repo name), ignoring case."""
    return claimed == ours or _model_name(claimed).lower() == _model_name(ours).lower()


class _TargetSelector:
    """PEFT's reading of target_modules: a string is a regular expression that must match a
    whole module name; a list entry matches a module name or its last dotted components.

    A pattern's matches share one time budget (``TARGET_PATTERN_BUDGET_S``) and run with the
    GIL released; ``AdapterError`` says when it is spent.
    """

    def __init__(self, targets: object) -> None:
        self.names: tuple[str, ...] = ()
        self.pattern: Any = None
        if isinstance(targets, str) and targets:
            if len(targets) > MAX_TARGET_PATTERN_LENGTH:
                raise AdapterError(
                    f"the target_modules regex is over {MAX_TARGET_PATTERN_LENGTH} characters; "
                    "list the module names instead"
                )
            try:
                self.pattern = regex.compile(targets)
            except regex.error as exc:
                raise AdapterError(
                    f"target_modules {targets!r} is not a valid regex: {exc}"
                ) from exc
        elif isinstance(targets, list) and targets:
            if not all(isinstance(target, str) and target for target in targets):
                raise AdapterError(
                    f"target_modules must be a list of module names, not {targets!r}"
                )
            self.names = tuple(targets)
        else:
            raise AdapterError("target_modules is missing or empty")
        self._deadline = time.monotonic() + TARGET_PATTERN_BUDGET_S
        self._decided: dict[str, bool] = {}

    def __call__(self, module: str) -> bool:
        if self.pattern is None:
            return any(module == name or module.endswith(f".{name}") for name in self.names)
        if module not in self._decided:
            timeout = max(self._deadline - time.monotonic(), 0.0)
            try:
                found = self.pattern.fullmatch(module, timeout=timeout, concurrent=True)
            except TimeoutError as exc:
                raise AdapterError(
                    f"the target_modules regex {self.pattern.pattern!r} takes too long to match "
                    "the base model's module names; list the module names instead"
                ) from exc
            self._decided[module] = found is not None
        return self._decided[module]


def _check_targets(select: _TargetSelector, universe: list[str], base: BaseModelInfo) -> list[str]:
    available = f"(linear layers: {', '.join(sorted(base.linear_shapes))})"
    targeted = [module for module in universe if select(module)]
    if select.pattern is not None and not targeted:
        raise AdapterError(
            f"target_modules regex {select.pattern.pattern!r} matches no linear layer of the "
            f"base model {available}"
        )
    unknown = [
        name for name in select.names if not any(_TargetSelector([name])(m) for m in universe)
    ]
    if unknown:
        raise AdapterError(
            "target_modules names modules that are not linear layers of the base model: "
            f"{', '.join(unknown)} {available}"
        )
    return targeted


def _module_shape(module: str, base: BaseModelInfo) -> tuple[int, int]:
    layer = _LAYER_INDEX.search(module)
    if layer is not None and int(layer[1]) >= base.num_layers:
        raise AdapterError(
            f"{module}: layer {layer[1]} does not exist (the base model has {base.num_layers})"
        )
    if base.modules:
        shape = base.modules.get(module)
    else:
        shape = base.linear_shapes.get(module.rsplit(".", 1)[-1])
    if shape is None:
        raise AdapterError(f"{module} is not a linear layer of the base model")
    return shape


def _check_tensors(path: Path, base: BaseModelInfo, rank: int, select: _TargetSelector) -> None:
    try:
        with safe_open(path, framework="np") as handle:
            header = {
                key: (handle.get_slice(key).get_dtype(), tuple(handle.get_slice(key).get_shape()))
                for key in handle.keys()  # noqa: SIM118 - safe_open is not a Mapping
            }
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{WEIGHTS_FILE} is not a valid safetensors file: {exc}") from exc
    kinds: dict[str, set[str]] = {}
    for name, (dtype, shape) in sorted(header.items()):
        if (match := _TENSOR_NAME.fullmatch(name)) is None:
            raise AdapterError(
                f"unexpected tensor {name!r}: {WEIGHTS_FILE} may hold only "
                "base_model.model.<module>.lora_A.weight and .lora_B.weight tensors"
            )
        module, kind = match["module"], match["kind"]
        out_features, in_features = _module_shape(module, base)
        if not select(module):
            raise AdapterError(f"tensor {name!r} adapts {module}, which target_modules excludes")
        if dtype not in TENSOR_DTYPES:
            allowed = ", ".join(TENSOR_DTYPES)
            raise AdapterError(f"tensor {name!r} has dtype {dtype}; only {allowed} are accepted")
        expected = (rank, in_features) if kind == "A" else (out_features, rank)
        if shape != expected:
            raise AdapterError(
                f"tensor {name!r} has shape {list(shape)}, expected {list(expected)} "
                f"(rank {rank}, base layer {out_features}x{in_features})"
            )
        kinds.setdefault(module, set()).add(kind)
    if not kinds:
        raise AdapterError(f"{WEIGHTS_FILE} holds no LoRA tensors")
    for module, present in sorted(kinds.items()):
        if present != {"A", "B"}:
            missing = "lora_B" if "A" in present else "lora_A"
            raise AdapterError(f"{module} has no {missing} tensor; lora_A and lora_B come in pairs")


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
