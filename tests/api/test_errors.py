"""Errors the framework raises keep their headers, and /openapi.json documents the one error
shape every route answers with (no FastAPI 422 that no route returns)."""

from __future__ import annotations

import httpx

from app.main import create_app
from app.settings import Settings


def _settings() -> Settings:
    return Settings(_env_file=None, model="unused", docs=True)  # type: ignore[call-arg]


async def test_method_not_allowed_keeps_its_allow_header() -> None:
    transport = httpx.ASGITransport(app=create_app(_settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        answer = await client.post("/healthz")
    assert answer.status_code == 405
    # RFC 9110: a 405 lists the methods the resource takes.
    assert answer.headers["allow"] == "GET"
    assert answer.json()["error"]["type"] == "invalid_request_error"


async def test_method_not_allowed_lists_the_methods_of_every_route_on_the_path() -> None:
    transport = httpx.ASGITransport(app=create_app(_settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        # No gateway (no lifespan): the edge leaves authentication to the routes, and
        # routing answers first.
        tenants = await client.request("OPTIONS", "/admin/v1/tenants")
        adapter = await client.put("/admin/v1/adapters/legal")
    assert tenants.status_code == adapter.status_code == 405
    assert tenants.headers["allow"] == "GET, POST"
    assert adapter.headers["allow"] == "DELETE, GET"


def test_openapi_documents_the_openai_error_shape_on_every_route() -> None:
    document = create_app(_settings()).openapi()
    error_schema = document["components"]["schemas"]["ErrorResponse"]
    assert error_schema["required"] == ["error"]
    operations = [
        (path, operation)
        for path, methods in document["paths"].items()
        if path.startswith(("/v1/", "/admin/v1/"))
        for operation in methods.values()
    ]
    assert len(operations) > 20
    for path, operation in operations:
        responses = operation["responses"]
        assert "422" not in responses, path
        for status in ("4XX", "5XX"):
            content = responses[status]["content"]["application/json"]["schema"]
            assert content == {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)
    for path in ("/v1/completions", "/v1/chat/completions"):
        # "stream": true answers with server-sent events.
        ok = document["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(ok) == {"application/json", "text/event-stream"}
