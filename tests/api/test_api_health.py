"""``/readyz`` says that the engine failed to start, never why: the exception's text (paths,
versions, the stack's messages) stays in the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from app.engine.base import Engine
from app.main import create_app
from tests.support.harness import app_settings

SECRET = "/srv/secret-models/acme-finetune: unsupported dtype bf16 on vllm 0.32.0+cpu"


@asynccontextmanager
async def failing_engine(_settings: object) -> AsyncIterator[Engine]:
    raise RuntimeError(SECRET)
    yield  # pragma: no cover


async def test_readyz_hides_why_the_engine_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(app_settings(tmp_path), engine_factory=failing_engine)
    with caplog.at_level(logging.ERROR):
        async with app.router.lifespan_context(app):
            while app.state.gateway.startup_error is None:
                await asyncio.sleep(0.01)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                answer = await client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {
        "status": "unavailable",
        "detail": "The inference engine failed to start.",
    }
    assert SECRET not in answer.text
    assert any(
        SECRET in record.getMessage() or SECRET in (record.exc_text or "")
        for record in caplog.records
    )
