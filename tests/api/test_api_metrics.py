"""/metrics names every tenant: the API port shows it only to a caller with the
metrics token (or an admin token); ``metrics_port`` serves it on a listener of its own.
Also: /docs and /openapi.json follow the ``docs`` setting."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from app import metrics
from app.main import create_app
from tests.support.edge_app import TENANT, call, running
from tests.support.harness import ADMIN_TOKEN, app_settings
from tests.support.servers import free_port

METRICS_TOKEN = "lgw-metrics-edge-test-token"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def record_traffic() -> None:
    # A sample labelled with the tenant, as a served request leaves.
    metrics.REQUESTS.labels(TENANT, "support", "chat", "ok").inc()


async def test_the_api_port_shows_metrics_only_with_credentials(tmp_path: Path) -> None:
    settings = app_settings(tmp_path, metrics_token=METRICS_TOKEN)
    async with running(settings) as edge:
        record_traffic()
        for headers in ({}, bearer("wrong"), bearer(edge.tenant_key)):
            answer = await call(edge.app, "GET", "/metrics", headers=headers)
            assert answer.status == 401
            assert TENANT.encode() not in answer.body
            assert answer.json()["error"]["code"] == "invalid_api_key"
        for token in (METRICS_TOKEN, ADMIN_TOKEN):
            answer = await call(edge.app, "GET", "/metrics", headers=bearer(token))
            assert answer.status == 200
            assert f'tenant="{TENANT}"'.encode() in answer.body


async def test_without_a_metrics_token_the_admin_token_reads_them(tmp_path: Path) -> None:
    async with running(app_settings(tmp_path)) as edge:
        record_traffic()
        refused = await call(edge.app, "GET", "/metrics")
        assert refused.status == 401
        assert TENANT.encode() not in refused.body
        answer = await call(edge.app, "GET", "/metrics", headers=bearer(ADMIN_TOKEN))
        assert answer.status == 200
        assert f'tenant="{TENANT}"'.encode() in answer.body


async def test_the_metrics_port_serves_the_same_metrics(tmp_path: Path) -> None:
    port = free_port()
    async with running(app_settings(tmp_path, metrics_port=port)) as edge:
        record_traffic()
        assert edge.app.state.metrics_address == ("127.0.0.1", port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            scraped = await client.get("/metrics")
            assert scraped.status_code == 200
            assert scraped.headers["content-type"].startswith("text/plain; version=")
            assert f'tenant="{TENANT}"' in scraped.text
            # The same exposition as the API port's (to a reader with credentials).
            api = await call(edge.app, "GET", "/metrics", headers=bearer(ADMIN_TOKEN))
            assert scraped.text.count("\n") == api.body.count(b"\n")
            # Nothing else is served there.
            for path in ("/v1/models", "/admin/v1/tenants", "/healthz", "/docs"):
                assert (await client.get(path)).status_code == 404
            # Still guarded on the API port.
            assert (await call(edge.app, "GET", "/metrics")).status == 401
    # Closed with the app.
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


async def test_the_metrics_port_takes_the_metrics_token_when_set(tmp_path: Path) -> None:
    port = free_port()
    settings = app_settings(tmp_path, metrics_port=port, metrics_token=METRICS_TOKEN)
    async with running(settings):
        record_traffic()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            refused = await client.get("/metrics")
            assert refused.status_code == 401
            assert TENANT not in refused.text
            answer = await client.get("/metrics", headers=bearer(METRICS_TOKEN))
            assert answer.status_code == 200
            assert f'tenant="{TENANT}"' in answer.text


async def test_a_taken_metrics_port_stops_the_start(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        settings = app_settings(tmp_path, metrics_port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="cannot serve metrics"):
            async with running(settings):
                pass


@pytest.mark.parametrize("docs", [True, False])
async def test_docs_follow_the_setting(tmp_path: Path, docs: bool) -> None:
    app = create_app(app_settings(tmp_path, docs=docs))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        for path in ("/docs", "/redoc", "/openapi.json"):
            response = await client.get(path)
            assert response.status_code == (200 if docs else 404), path
            if not docs:
                assert response.json()["error"]["type"] == "invalid_request_error"
