"""Cold load of one adapter from S3-compatible storage against the same load from local disk.

``python -m tools.adapter_store_bench --adapter var/adapters/legal_advisor --loads 50`` starts
moto's S3 server (``moto[server]``, from the dev extra) on a loopback port in its own process,
uploads the adapter as the S3 adapter store does (files, then the manifest), and times
``--loads`` loads of each kind:

- local: ``safetensors.torch.load_file`` of the weights in the adapter's directory (how
  vLLM reads an adapter from disk);
- s3: a fetch into a fresh, empty host cache (manifest, every file, sha256 of each and of
  the content, atomic rename) and then the same ``load_file`` from the cache;
- s3_fetch_only: the fetch alone.

Each kind gets one untimed load first.

It prints the median and p99 of each in milliseconds, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from safetensors.torch import load_file

from app.tenancy.adapters import WEIGHTS_FILE, content_sha256
from app.tenancy.storage.cache import AdapterCache
from app.tenancy.storage.manifest import Manifest
from app.tenancy.storage.s3 import S3Content, S3Location, s3_client


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_s3() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{endpoint}/").status_code == 200:
                return process, endpoint
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("moto's S3 server did not start")


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _timed(load: Callable[[], object], loads: int) -> dict[str, float]:
    load()  # untimed: the first call also pays for lazy imports and allocator warm-up
    samples = []
    for _ in range(loads):
        started = time.perf_counter()
        load()
        samples.append((time.perf_counter() - started) * 1000)
    return {
        "median_ms": round(statistics.median(samples), 1),
        "p99_ms": round(_percentile(samples, 0.99), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", type=Path, default=Path("var/adapters/legal_advisor"))
    parser.add_argument("--loads", type=int, default=50)
    args = parser.parse_args()

    process, endpoint = _start_s3()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    work = Path(tempfile.mkdtemp(prefix="lgw-store-bench-"))
    try:
        location = S3Location("bench", "adapters")
        s3_client().create_bucket(Bucket=location.bucket)
        content = S3Content(location)
        digest = content_sha256(args.adapter)
        content.upload(args.adapter, Manifest.of_directory(args.adapter, digest))
        fresh = iter(range(3 * (args.loads + 1)))

        def fetch() -> Path:
            cache = AdapterCache(work / f"cache-{next(fresh)}", max_bytes=1 << 32)
            return cache.fetch(digest, content)

        result = {
            "adapter": str(args.adapter),
            "bytes": sum(p.stat().st_size for p in args.adapter.iterdir()),
            "loads": args.loads,
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, S3 on loopback",
            "local": _timed(lambda: load_file(args.adapter / WEIGHTS_FILE), args.loads),
            "s3": _timed(lambda: load_file(fetch() / WEIGHTS_FILE), args.loads),
            "s3_fetch_only": _timed(fetch, args.loads),
        }
        print(json.dumps(result, indent=1))
    finally:
        process.terminate()
        process.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
