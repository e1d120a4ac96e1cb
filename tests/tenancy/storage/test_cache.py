"""The host's adapter cache (app/tenancy/storage/cache.py) with content from memory: users
that hold an entry never keep another thread or process from fetching it."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.tenancy.adapters import content_sha256
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.manifest import Manifest, StoredFile

WAIT_S = 10


class MemorySource:
    """Content served from a directory, each download able to wait for a go-ahead."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.digest = content_sha256(directory)
        self.downloads = 0
        self.go = threading.Event()
        self.go.set()

    def manifest(self, digest: str) -> Manifest:
        return Manifest.of_directory(self.directory, digest)

    def download(self, digest: str, file: StoredFile, target: Path) -> None:
        assert self.go.wait(WAIT_S)
        self.downloads += 1
        shutil.copyfile(self.directory / file.name, target)


@pytest.fixture
def source(tmp_path: Path) -> MemorySource:
    content = tmp_path / "content"
    content.mkdir()
    (content / "adapter_config.json").write_text('{"r": 8}')
    (content / "adapter_model.safetensors").write_bytes(os.urandom(4096))
    return MemorySource(content)


def test_a_fetch_is_not_held_up_by_a_user_that_looked_before_the_content_came(
    tmp_path: Path, source: MemorySource
) -> None:
    cache = AdapterCache(tmp_path / "cache", max_bytes=1 << 30)
    (cache.root / "locks").mkdir(parents=True)
    # Another thread or process that took the entry's shared lock, found nothing yet and holds
    # it still (as the engine's resolver holds what it serves).
    user = os.open(cache.root / "locks" / f"{source.digest}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(user, fcntl.LOCK_SH)
    try:
        with ThreadPoolExecutor(1) as pool:
            fetched = pool.submit(cache.fetch, source.digest, source).result(timeout=WAIT_S)
    finally:
        os.close(user)
    assert content_sha256(fetched) == source.digest


def test_callers_that_wait_for_a_download_get_it_while_the_first_still_holds_it(
    tmp_path: Path, source: MemorySource
) -> None:
    cache = AdapterCache(tmp_path / "cache", max_bytes=1 << 30)
    source.go.clear()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache.open(source.digest, source):
            holding.set()
            release.wait(WAIT_S)

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(hold)
        waiting = [pool.submit(cache.fetch, source.digest, source) for _ in range(6)]
        source.go.set()
        assert holding.wait(WAIT_S)
        paths = {future.result(timeout=WAIT_S) for future in waiting}
        release.set()
        first.result(timeout=WAIT_S)
    assert paths == {cache.path(source.digest)}
    assert source.downloads == 2  # the manifest's two files, once


def test_an_entry_in_use_is_not_evicted_and_one_unused_is(tmp_path: Path) -> None:
    sources = []
    for seed in range(3):
        content = tmp_path / f"content-{seed}"
        content.mkdir()
        (content / "adapter_model.safetensors").write_bytes(os.urandom(1000))
        sources.append(MemorySource(content))
    cache = AdapterCache(tmp_path / "cache", max_bytes=2500)
    in_use, unused, incoming = sources
    cache.fetch(unused.digest, unused)
    with cache.open(in_use.digest, in_use):
        os.utime(cache.path(in_use.digest), (0, 0))  # the least recently used, yet held
        cache.fetch(incoming.digest, incoming)
        assert cache.path(in_use.digest).is_dir()
    assert not cache.path(unused.digest).is_dir()
    assert cache.path(incoming.digest).is_dir()
