"""Adapters on disk, each version identified by the hash of its content."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


class AdapterError(ValueError):
    """An adapter directory that cannot be served."""


@dataclass(frozen=True)
class Adapter:
    """One immutable adapter version.

    vLLM keys its worker cache on ``lora_id`` and its prefix cache on the
    LoRA name, so both are unique per version: new weights under an old
    name can never be served from a stale cache.
    """

    name: str
    sha256: str
    path: Path
    rank: int
    target_modules: tuple[str, ...]
    lora_id: int

    @property
    def version(self) -> str:
        return self.sha256[:12]

    @property
    def engine_name(self) -> str:
        return f"{self.name}@{self.version}"


def content_sha256(directory: Path) -> str:
    """Hash of every file's relative path and bytes, in a stable order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(file.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def read_lora_config(directory: Path, max_rank: int) -> tuple[int, tuple[str, ...]]:
    """Rank and target modules of a PEFT LoRA adapter, after basic checks."""
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{directory}: unreadable {CONFIG_FILE}: {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{directory}: not a LoRA adapter (peft_type={config['peft_type']})")
    if not (directory / WEIGHTS_FILE).is_file():
        raise AdapterError(f"{directory}: {WEIGHTS_FILE} is missing (only safetensors are served)")
    rank = int(config.get("r", 0))
    if not 1 <= rank <= max_rank:
        raise AdapterError(f"{directory}: rank {rank} is outside 1..{max_rank}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    return rank, tuple(sorted(targets))


class AdapterCatalog:
    """The adapters under one root directory: ``<root>/<name>/`` per adapter."""

    def __init__(self, root: Path, *, max_rank: int) -> None:
        self._root = root
        self._max_rank = max_rank
        self._ids = itertools.count(1)
        self._adapters: dict[str, Adapter] = {}

    def scan(self) -> None:
        """(Re)read the root; a changed directory becomes a new version."""
        found: dict[str, Adapter] = {}
        directories = sorted(self._root.iterdir()) if self._root.is_dir() else []
        for directory in directories:
            if not directory.is_dir() or directory.name.endswith(".partial"):
                continue
            try:
                found[directory.name] = self._load(directory)
            except AdapterError as exc:
                logger.error("skipping adapter: %s", exc)
        self._adapters = found

    def _load(self, directory: Path) -> Adapter:
        rank, targets = read_lora_config(directory, self._max_rank)
        sha = content_sha256(directory)
        known = self._adapters.get(directory.name)
        if known is not None and known.sha256 == sha:
            return known
        return Adapter(
            name=directory.name,
            sha256=sha,
            path=directory.resolve(),
            rank=rank,
            target_modules=targets,
            lora_id=next(self._ids),
        )

    def get(self, name: str) -> Adapter | None:
        return self._adapters.get(name)

    def __iter__(self) -> Iterator[Adapter]:
        return iter(self._adapters.values())
