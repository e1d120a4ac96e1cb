"""The application factory: nothing happens at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from app import __version__, tracing
from app.api import batches, files, health, metrics, openai, organization, responses
from app.api.admin import router as admin_router
from app.api.admin.failure_audit import AuthFailureThrottle
from app.api.errors import install_error_handlers
from app.api.generation_lane import GenerationLane
from app.api.middleware import EarlyRefusalMiddleware, RequestIdMiddleware
from app.api.routes import include_routers
from app.api.streaming_app import StreamingApp
from app.console import install_console
from app.gateway import Gateway
from app.metrics import multiprocess_dir
from app.serving.backend import backend_factory
from app.serving.in_process.backend import EngineFactory, start_vllm_engine
from app.settings import Settings
from app.store.db import open_database
from app.tenancy.base_model import BaseModelInfo

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None, *, engine_factory: EngineFactory = start_vllm_engine
) -> FastAPI:
    """The gateway's app for ``settings``; ``engine_factory`` starts the in-process engine
    (tests pass a scripted one)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before the engine: vLLM's in-process spans go to the gateway's tracer provider.
        tracing.configure()
        async with AsyncExitStack() as stack:
            # First in, last out: the engine's processes, spawned below, inherit
            # the directory; it goes once they have shut down.
            app.state.metrics_dir = stack.enter_context(multiprocess_dir())
            sessions = await stack.enter_async_context(open_database(settings.database_url))
            base_model = await asyncio.to_thread(BaseModelInfo.for_settings, settings)
            # After the metrics directory: admission writes its gauges from the start.
            backends = backend_factory(settings, engine_factory)
            gateway = Gateway(settings, sessions, base_model, backends)
            stack.push_async_callback(gateway.quota.close)
            await gateway.reload()
            app.state.gateway = gateway
            if settings.metrics_port is not None:
                # Before the engine: its metrics are scraped from the first sample on.
                metrics_app = metrics.metrics_only_app(settings, gateway, app.state.metrics_dir)
                app.state.metrics_address = await stack.enter_async_context(
                    metrics.metrics_listener(metrics_app, settings)
                )
            await stack.enter_async_context(gateway.running())
            # The backend (the engine, or the front's tokenizer) loads in the background: the
            # server answers /healthz (and 503 elsewhere) while it loads.
            starting = asyncio.create_task(gateway.start_backend(stack))
            try:
                yield
            finally:
                # A half-built engine must still be shut down: wait for it.
                await starting
                gateway.stop_backend()

    app = StreamingApp(
        title="LoRA Gateway",
        version=__version__,
        description="Multi-tenant, OpenAI-compatible LoRA serving over one vLLM engine.",
        lifespan=lifespan,
        docs_url="/docs" if settings.docs else None,
        redoc_url="/redoc" if settings.docs else None,
        openapi_url="/openapi.json" if settings.docs else None,
    )
    # Refused admin tokens, at the admin API or the console's sign-in: one throttle for both.
    app.state.auth_failure_throttle = AuthFailureThrottle()
    # The last added runs first: every answer, early refusals included, has an id; the
    # completion endpoints' lane past the router runs last, after the early refusals.
    app.add_middleware(GenerationLane)
    app.add_middleware(
        EarlyRefusalMiddleware,
        max_request_bytes=settings.max_request_bytes,
        max_upload_bytes=settings.max_adapter_bytes,
        max_file_bytes=settings.max_file_bytes,
        metrics_token=settings.metrics_token.get_secret_value() if settings.metrics_token else None,
        auth_failure_throttle=app.state.auth_failure_throttle,
    )
    app.add_middleware(RequestIdMiddleware)
    install_error_handlers(app)
    include_routers(
        app,
        health.router,
        openai.router,
        responses.router,
        files.router,
        batches.router,
        organization.router,
        metrics.router,
        admin_router,
    )
    install_console(app, settings)
    return app
