"""`lora-gateway serve` as an operator runs it: settings from the environment,
HTTPS when given a certificate, a tenant key issued by the CLI."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.live_gateway import gateway_process
from tests.support.servers import free_port
from tests.support.tls import self_signed_certificate
from tools.demo.training import DEMO_ADAPTERS

pytestmark = pytest.mark.slow


def test_serve_over_https_with_settings_from_the_environment(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    port = free_port()
    env = {
        **os.environ,
        "LORA_GATEWAY_PORT": str(port),
        "LORA_GATEWAY_SSL_CERTFILE": str(cert),
        "LORA_GATEWAY_SSL_KEYFILE": str(key),
        "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "LORA_GATEWAY_MAX_MODEL_LEN": "512",
        "LORA_GATEWAY_KV_CACHE_GIB": "1",
    }
    cli = [sys.executable, "-m", "app.cli"]

    def run(*args: str) -> str:
        done = subprocess.run([*cli, *args], env=env, check=True, capture_output=True, text=True)
        return done.stdout.strip()

    for adapter in DEMO_ADAPTERS:
        run("adapters", "register", adapter)
    assert "granted acme-legal:legal_advisor" in run("tenants", "apply", "tenants/")
    assert run("tenants", "apply", "tenants/").endswith("no change")
    tenant_key = run("keys", "create", "acme-legal")
    base_url = f"https://127.0.0.1:{port}"
    with (
        httpx.Client(verify=ssl.create_default_context(cafile=cert)) as http,
        gateway_process(env, base_url, http),
    ):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz")  # plaintext is refused
        client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key=tenant_key, http_client=http, max_retries=0
        )
        response = client.chat.completions.create(
            model="legal_advisor",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=5,
        )
        assert response.usage is not None and response.usage.completion_tokens >= 1
