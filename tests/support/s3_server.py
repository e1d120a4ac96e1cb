"""A throwaway S3 server on a free loopback port: moto's server mode (``moto[server]``), a
real S3 protocol endpoint in its own process, spoken to over HTTP by boto3 as AWS would be."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.servers import free_port, stop, wait_until_ready

# moto accepts any credentials; boto3 only needs some to sign with.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def s3_server() -> Iterator[str]:
    """Run moto's S3 server until the block ends; yields its endpoint URL (for
    ``AWS_ENDPOINT_URL``). State lives in the process's memory and goes with it."""
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(f"{endpoint}/", alive=lambda: process.poll() is None, timeout=30)
        yield endpoint
    finally:
        stop(process)


def use_s3(env: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point boto3 at ``endpoint`` (the standard ``AWS_*`` variables, with credentials it
    can sign with) for as long as ``env`` lasts."""
    for name, value in CREDENTIALS.items():
        env.setenv(name, value)
    env.setenv("AWS_ENDPOINT_URL", endpoint)
