"""One engine process's cold load of stored adapter content, for tests that start several
processes at once."""

from __future__ import annotations

from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.s3 import S3Content, S3Location


def cold_load(
    cache_root: Path, location: S3Location, digest: str, start: Barrier, results: Queue[Any]
) -> None:
    """Fetch ``digest`` into the host cache at ``cache_root`` once every process is ready;
    put (the path, the keys this process sent GETs for) on ``results``."""
    content = S3Content(location)
    gets: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        gets.append(params["Key"])

    content.client.meta.events.register("provide-client-params.s3.GetObject", record)
    start.wait()
    path = AdapterCache(cache_root, max_bytes=1 << 30).fetch(digest, content)
    results.put((path, gets))
