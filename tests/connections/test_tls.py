"""When the gateway terminates TLS, a handshake that does not finish in time is dropped."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx

from tests.connections.probe_server import read_until_closed, serving
from tests.support.tls import self_signed_certificate


async def test_a_stalled_tls_handshake_is_dropped_and_https_is_served(tmp_path: Path) -> None:
    cert_file, key_file = self_signed_certificate(tmp_path)
    tls = {"ssl_certfile": cert_file, "ssl_keyfile": key_file}
    async with serving(tls_handshake_timeout_seconds=0.5, **tls) as running:
        reader, writer = await running.connect()  # plain TCP: no ClientHello ever comes
        started = time.monotonic()
        _, closed = await read_until_closed(reader, timeout=9)
        writer.close()
        # The configured 0.5 s, not the default 10 s: slack for a busy machine.
        assert closed and time.monotonic() - started < 8

        context = ssl.create_default_context(cafile=str(cert_file))
        context.check_hostname = False
        async with httpx.AsyncClient(verify=context) as client:
            response = await client.get(f"https://127.0.0.1:{running.port}/healthz")
        assert response.status_code == 200
