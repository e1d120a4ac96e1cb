"""``GET /metrics``: every process's metrics in the Prometheus text format.

Our metrics (:mod:`app.metrics`, recorded in the gateway and in vLLM's
engine processes), merged from the multiprocess directory the lifespan sets
up, and vLLM's own ``vllm:*`` engine metrics, which its ``PrometheusStatLogger``
keeps in this process's memory.

They name every tenant, alias and adapter, so no caller without credentials
sees them on the API port: :class:`app.api.middleware.EarlyRefusalMiddleware`
asks for the metrics token (or an admin token) there. With ``metrics_port``,
:func:`metrics_listener` serves the same endpoint on a port of its own, open
unless a metrics token is set: for a network where only the scraper reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from app.api.errors import install_error_handlers
from app.api.middleware import EarlyRefusalMiddleware
from app.gateway import Gateway
from app.metrics import flush_held, render
from app.settings import Settings

logger = logging.getLogger(__name__)

router = APIRouter(tags=["metrics"])

# Drain time for a scrape in progress when the gateway stops.
SHUTDOWN_SECONDS = 5


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    # What the request path holds in memory is written out first, on the event loop that
    # holds it; merging the files reads the disk, in a worker thread. The directory is this
    # app's own (set by its lifespan); without one, the environment's.
    flush_held()
    directory = getattr(request.app.state, "metrics_dir", None)
    body, content_type = await run_in_threadpool(render, directory)
    return Response(content=body, media_type=content_type)


def metrics_only_app(settings: Settings, gateway: Gateway, metrics_dir: Path) -> FastAPI:
    """``GET /metrics`` and nothing else, over the gateway's metrics directory."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    app.state.metrics_dir = metrics_dir
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    app.add_middleware(
        EarlyRefusalMiddleware,
        max_request_bytes=settings.max_request_bytes,
        max_upload_bytes=0,
        metrics_token=token,
        metrics_listener=True,
    )
    install_error_handlers(app)
    app.include_router(router)
    return app


class _SecondServer(uvicorn.Server):
    """A uvicorn server beside the main one: it leaves signals to the main server
    (which stops the lifespan, and this server with it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise RuntimeError(f"cannot serve metrics on {host}:{port}: {exc}") from exc


@asynccontextmanager
async def metrics_listener(app: FastAPI, settings: Settings) -> AsyncIterator[tuple[str, int]]:
    """Serve ``app`` on ``settings.host:settings.metrics_port`` (TLS as the API port)
    until the block ends; yields the address bound. Fails at once if the port is taken."""
    assert settings.metrics_port is not None
    sock = _listen(settings.host, settings.metrics_port)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
    )
    server = _SecondServer(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                serving.result()  # its failure, raised here
                raise RuntimeError("the metrics listener stopped before it started")
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        logger.info("serving /metrics on %s:%d", host, port)
        yield host, port
    finally:
        server.should_exit = True
        await serving
        sock.close()
