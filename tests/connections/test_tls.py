"""When the gateway terminates TLS, a handshake that does not finish in time is dropped."""

from __future__ import annotations

import datetime
import ssl
import time
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.connections.harness import read_until_closed, serving


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_a_stalled_tls_handshake_is_dropped_and_https_is_served(tmp_path: Path) -> None:
    cert_file, key_file = self_signed(tmp_path)
    tls = {"ssl_certfile": cert_file, "ssl_keyfile": key_file}
    async with serving(tls_handshake_timeout_seconds=0.5, **tls) as running:
        reader, writer = await running.connect()  # plain TCP: no ClientHello ever comes
        started = time.monotonic()
        _, closed = await read_until_closed(reader, timeout=5)
        writer.close()
        assert closed and time.monotonic() - started < 4

        context = ssl.create_default_context(cafile=str(cert_file))
        context.check_hostname = False
        async with httpx.AsyncClient(verify=context) as client:
            response = await client.get(f"https://127.0.0.1:{running.port}/healthz")
        assert response.status_code == 200
