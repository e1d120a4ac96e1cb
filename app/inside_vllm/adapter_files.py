"""An adapter's weights file read with one system call per tensor, for vLLM's adapter loads.

vLLM loads an adapter (``LoRAModel.from_local_checkpoint``) inside an engine step, so every
running request waits for the load, and it reads the weights through ``safetensors.safe_open``,
whose ``get_tensor`` costs more in its binding than in the copy: an adapter holds two tensors
per layer and module, hundreds in all. :func:`safe_open` reads the file's header once and
each tensor asked for with one ``pread`` into a buffer of its own: the same independent
tensors, read from the file rather than memory-mapped. A file it cannot read that way (a dtype
it does not map, a header that does not add up) goes to safetensors' own reader, which
says what is wrong with it. docs/performance-log.md has what a load cost before and after.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Self

import safetensors
import torch

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
HEADER_SIZE = struct.Struct("<Q")  # the header's length in bytes, little-endian


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # from the file's start
    nbytes: int


class AdapterWeightsFile:
    """The reading half of ``safetensors.safe_open`` (``keys``, ``get_tensor``) over an open
    file and its parsed header."""

    def __init__(self, path: str, fd: int, entries: dict[str, Entry]) -> None:
        self.path = path
        self._fd = fd
        self._entries = entries

    @classmethod
    def open(cls, path: str) -> AdapterWeightsFile | None:
        """The file, or ``None`` where its header is not one this reader takes."""
        fd = os.open(path, os.O_RDONLY)
        entries = None
        try:
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError, struct.error):
                entries = _entries(fd, os.fstat(fd).st_size)
        finally:
            if entries is None:
                os.close(fd)
        return None if entries is None else cls(path, fd, entries)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def keys(self) -> list[str]:
        return sorted(self._entries)

    def get_tensor(self, name: str) -> torch.Tensor:
        entry = self._entries[name]
        if not entry.nbytes:
            return torch.empty(entry.shape, dtype=entry.dtype)
        buffer = bytearray(entry.nbytes)
        if os.preadv(self._fd, [buffer], entry.offset) != entry.nbytes:
            raise OSError(f"{self.path}: {name} ends past the end of the file")
        return torch.frombuffer(buffer, dtype=entry.dtype).view(entry.shape)


def _entries(fd: int, file_size: int) -> dict[str, Entry] | None:
    """The header's tensors, each checked to lie within the file at the size its dtype and
    shape give; ``None`` where one does not."""
    (header_size,) = HEADER_SIZE.unpack(os.pread(fd, HEADER_SIZE.size, 0))
    data_start = HEADER_SIZE.size + header_size
    if data_start > file_size:
        return None
    header = json.loads(os.pread(fd, header_size, HEADER_SIZE.size))
    header.pop("__metadata__", None)
    entries = {}
    for name, info in header.items():
        dtype = DTYPES.get(info["dtype"])
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        if dtype is None or not all(isinstance(n, int) and n >= 0 for n in (*shape, begin)):
            return None
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes or data_start + end > file_size:
            return None
        entries[name] = Entry(dtype, shape, data_start + begin, nbytes)
    return entries


def safe_open(filename: str, framework: str, device: str = "cpu") -> Any:
    """``safetensors.safe_open``: this module's reader where it applies (torch tensors on the
    CPU, a little-endian machine, a header it takes), safetensors' own otherwise."""
    if framework in ("pt", "torch") and str(device) == "cpu" and sys.byteorder == "little":
        opened = AdapterWeightsFile.open(os.fspath(filename))
        if opened is not None:
            return opened
    return safetensors.safe_open(filename, framework=framework, device=device)


class Safetensors:
    """The ``safetensors`` module as vLLM's adapter loader sees it: :func:`safe_open` in
    place of its own, everything else the module's."""

    safe_open = staticmethod(safe_open)

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def install() -> None:
    """Read adapters with :func:`safe_open` in vLLM's loader; idempotent."""
    from vllm.lora import lora_model

    shipped = lora_model.safetensors  # type: ignore[attr-defined]
    if not isinstance(shipped, Safetensors):
        lora_model.safetensors = Safetensors(shipped)  # type: ignore[attr-defined,assignment]
