"""Errors the framework raises keep their headers, a store that cannot serve now is a retryable
503, and /openapi.json documents the one error shape every route answers with (no FastAPI 422
that no route returns)."""

from __future__ import annotations

import httpx
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from app.main import create_app
from app.settings import Settings
from tests.support.servers import postgres_starting_up


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


async def test_a_store_starting_up_is_a_retryable_503_and_a_refused_statement_a_500() -> None:
    app = create_app(_settings())
    async with postgres_starting_up() as url:
        engine = create_async_engine(url)

        @app.get("/query")
        async def query() -> None:
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))

        @app.get("/refused")
        async def refused() -> None:
            # What the store says of a statement (a constraint broken, say) is not an outage.
            raise DBAPIError("INSERT", {}, Exception("violates check constraint"))

        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            starting_up = await client.get("/query")
            statement = await client.get("/refused")
        await engine.dispose()
    assert starting_up.status_code == 503
    assert starting_up.json()["error"]["code"] == "store_unavailable"
    assert statement.status_code == 500
    assert statement.json()["error"]["type"] == "server_error"


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
