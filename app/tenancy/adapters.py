"""Adapter versions as the engine sees them, and their content hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


class AdapterError(ValueError):
    """An adapter that cannot be accepted or served; the message says why."""


@dataclass(frozen=True)
class Adapter:
    """One immutable adapter version.

    vLLM keys its worker cache on ``lora_id`` and its prefix cache on the
    LoRA name, so both are unique per version: new weights under an old
    name can never be served from a stale cache.
    """

    name: str
    version: int
    sha256: str
    path: Path
    rank: int
    target_modules: tuple[str, ...]
    lora_id: int
    # Why the engine could not load it (it is refused from then on); not part of its identity.
    unservable: str | None = field(default=None, compare=False)

    @property
    def engine_name(self) -> str:
        return f"{self.name}@v{self.version}"


def content_sha256(directory: Path) -> str:
    """Hash of every file's relative path and bytes, in a stable order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(file.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()
