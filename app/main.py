"""The application factory: nothing happens at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from app import __version__
from app.api import health, openai
from app.api.errors import install_error_handlers
from app.api.middleware import RequestIdMiddleware
from app.engine.base import Engine
from app.gateway import Gateway
from app.settings import Settings
from app.tenancy.adapters import AdapterCatalog
from app.tenancy.manifests import load_tenants
from app.tenancy.registry import TenantRegistry

logger = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], AbstractAsyncContextManager[Engine]]


def load_registry(settings: Settings) -> TenantRegistry:
    adapters = AdapterCatalog(settings.adapter_root, max_rank=settings.max_lora_rank)
    adapters.scan()
    tenants, keys = load_tenants(settings.tenants_dir, settings.api_keys_file)
    return TenantRegistry(tenants, keys, adapters, base_model_id=settings.base_model_id)


def default_engine_factory(settings: Settings) -> AbstractAsyncContextManager[Engine]:
    from app.engine.vllm_engine import start_vllm_engine  # imports vLLM: only when used

    return start_vllm_engine(settings)


async def _start_engine(stack: AsyncExitStack, factory: EngineFactory, gateway: Gateway) -> None:
    try:
        gateway.attach_engine(await stack.enter_async_context(factory(gateway.settings)))
        logger.info("engine ready: serving %s", gateway.settings.model)
    except Exception as exc:
        gateway.startup_error = f"{type(exc).__name__}: {exc}"
        logger.exception("engine failed to start")


def create_app(
    settings: Settings | None = None, *, engine_factory: EngineFactory = default_engine_factory
) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway = Gateway(settings, load_registry(settings))
        app.state.gateway = gateway
        async with AsyncExitStack() as stack:
            # The engine loads in the background: the server answers /healthz
            # (and 503 elsewhere) while the model loads.
            starting = asyncio.create_task(_start_engine(stack, engine_factory, gateway))
            try:
                yield
            finally:
                # A half-built engine must still be shut down: wait for it.
                await starting
                gateway.attach_engine(None)

    app = FastAPI(
        title="LoRA Gateway",
        version=__version__,
        description="Multi-tenant, OpenAI-compatible LoRA serving over one vLLM engine.",
        lifespan=lifespan,
    )
    app.add_middleware(RequestIdMiddleware)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(openai.router)
    return app
