"""The connection limits (app/connections) in front of the real app: a tenant's client that
stops reading its stream is dropped after the write timeout, and its concurrency slot with it.
Served by :class:`~app.server.GuardedServer` as ``lora-gateway serve`` serves it."""

from __future__ import annotations

import asyncio
import faulthandler
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from app.server import GuardedServer, connection_limits, server_config
from app.settings import Settings
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import Served, ServeFactory


def guarded(app: FastAPI, settings: Settings) -> uvicorn.Server:
    # No app given: the engine watchdog (and its gc.freeze) stays out of the test process.
    return GuardedServer(server_config(app, settings), limits=connection_limits(settings))


@asynccontextmanager
async def serve_guarded(
    serve: ServeFactory, engine: ScriptedEngine, **overrides: Any
) -> AsyncIterator[Served]:
    try:
        async with serve(
            engine, server_factory=guarded, log_level="warning", **overrides
        ) as served:
            yield served
    finally:
        # GuardedServer's exit deadline is for a process that ends with it; this one goes on.
        faulthandler.cancel_dump_traceback_later()


async def test_a_stream_left_unread_is_dropped_and_frees_its_concurrency_slot(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine()
    settings = {"response_write_timeout_seconds": 0.5, "max_model_len": 1_000_000}
    async with serve_guarded(serve, engine, **settings) as served:
        await served.set_quota(max_concurrent_requests=1)
        body = json.dumps(
            {"model": served.model, "prompt": "hi", "max_tokens": 500_000, "stream": True}
        ).encode()
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {served.key}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, ("127.0.0.1", int(served.base_url.rsplit(":", 1)[1])))
            await loop.sock_sendall(sock, head + body)
            # Never read: the stream stalls, then the server drops this client.
            for _ in range(300):
                if engine.aborted:
                    break
                await asyncio.sleep(0.05)
            assert len(engine.aborted) == 1, "the unread stream was not ended"
            async with served.client() as client:
                short = {"model": served.model, "prompt": "hi", "max_tokens": 3}
                response = await client.post("/v1/completions", json=short)
            assert response.status_code == 200, response.text  # the slot was free again
        finally:
            sock.close()
