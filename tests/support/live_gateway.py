"""The end-to-end harness: real gateways on loopback (the vLLM engine on the embedded model),
in this process on a thread of their own (:func:`running_gateway`), borrowing another's
engine (:func:`borrowing_gateway`), or as ``lora-gateway serve`` processes
(:func:`gateway_process`); and the settings and store set-up they share."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import uvicorn
from fastapi import FastAPI

from app.cli import apply_tenants, create_key, register_adapter
from app.engine.base import Engine
from app.main import create_app
from app.serving.in_process.backend import EngineFactory, start_vllm_engine
from app.settings import Settings
from tests.support.servers import free_port, wait_until_ready

T = TypeVar("T")

ENGINE_START_TIMEOUT_S = 600
MAX_MODEL_LEN = 1024


@dataclass
class LiveGateway:
    base_url: str
    app: FastAPI
    settings: Settings
    keys: dict[str, str]
    loop: asyncio.AbstractEventLoop
    """The event loop the gateway serves on: the engine's, which only it may call."""

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run ``work`` on the gateway's event loop, from the test's thread."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    @property
    def engine(self) -> Engine:
        return self.app.state.gateway.backend.engine

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.keys[tenant], max_retries=0
        )

    def async_client(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.keys[tenant], max_retries=0
        )

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"{self.base_url}/admin/v1",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

    def wait_idle(self, timeout: float = 10.0) -> int:
        """Unfinished engine requests once they drain (or at the timeout)."""
        deadline = time.monotonic() + timeout
        while self.engine.num_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.engine.num_unfinished_requests()


def prepare_store(
    settings: Settings, adapters: Iterable[str], tenants: Iterable[str]
) -> dict[str, str]:
    """Register ``adapters`` (directories under the adapter root), apply the
    manifests in ``settings.tenants_dir``, and issue one key per tenant."""

    async def prepare() -> dict[str, str]:
        for name in adapters:
            await register_adapter(settings, name, name)
        await apply_tenants(settings, settings.tenants_dir, prune=False)
        return {tenant: await create_key(settings, tenant, "test") for tenant in tenants}

    return asyncio.run(prepare())


@contextmanager
def running_gateway(
    settings: Settings,
    keys: dict[str, str],
    *,
    engine_factory: EngineFactory = start_vllm_engine,
    start_timeout: float = ENGINE_START_TIMEOUT_S,
) -> Iterator[LiveGateway]:
    """Serve ``create_app(settings, engine_factory=...)`` on loopback, in a thread with an
    event loop of its own, until the block ends: the real engine by default, or a scripted
    one (the fuzz suite)."""
    app = create_app(settings, engine_factory=engine_factory)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(),), name="gateway", daemon=True
    )
    thread.start()
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_until_ready(f"{base_url}/readyz", alive=thread.is_alive, timeout=start_timeout)
        yield LiveGateway(base_url, app, settings, keys, loop)
    finally:
        server.should_exit = True
        thread.join(timeout=120)
        loop.close()


ENGINE_FIELDS = ("model", "dtype", "max_model_len", "kv_cache_gib", "max_num_seqs", "max_loras")
ENGINE_FIELDS += ("max_cpu_loras", "max_lora_rank", "isolation_fix", "structured_outputs_compact")


@contextmanager
def borrowing_gateway(host: LiveGateway, settings: Settings) -> Iterator[LiveGateway]:
    """Serve ``create_app(settings)`` on loopback, on ``host``'s engine and event loop, until
    the block ends: a gateway with settings of its own (its store, quotas, scheduler) without
    an engine start of its own. The engine's settings must be the host's. The engine forgets
    its adapters before and after: another store numbers its adapters anew."""
    differ = [f for f in ENGINE_FIELDS if getattr(settings, f) != getattr(host.settings, f)]
    assert not differ, f"a borrowing gateway runs the host's engine; these differ: {differ}"

    @asynccontextmanager
    async def lent(_: Settings) -> AsyncIterator[Engine]:
        await forget_adapters(host.engine)
        try:
            yield host.engine
        finally:
            await forget_adapters(host.engine)

    app = create_app(settings, engine_factory=lent)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    )
    serving = asyncio.run_coroutine_threadsafe(server.serve(), host.loop)
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_until_ready(f"{base_url}/readyz", alive=lambda: not serving.done(), timeout=60)
        yield LiveGateway(base_url, app, settings, {}, host.loop)
    finally:
        server.should_exit = True
        serving.result(timeout=120)


def borrowed_settings(host: LiveGateway, state_dir: Path, **overrides: Any) -> Settings:
    """Settings for a gateway borrowing ``host``'s engine (:func:`borrowing_gateway`), with a
    store of its own in ``state_dir`` (shared by gateways given the same one)."""
    engine = {field: getattr(host.settings, field) for field in ENGINE_FIELDS}
    return make_settings(state_dir, **{**engine, **overrides})


async def forget_adapters(engine: Engine) -> None:
    """Remove every adapter from vLLM's caches (its LoRA ids are a store's row ids)."""
    llm = engine._llm  # type: ignore[attr-defined]
    for lora_id in await llm.list_loras():
        await llm.remove_lora(lora_id)


@contextmanager
def gateway_process(
    env: dict[str, str], base_url: str, http: httpx.Client | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``lora-gateway serve`` with ``env`` as its whole environment until the block ends;
    it must be ready at ``base_url`` (asked through ``http``) and stop cleanly on SIGINT."""
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"], env=env, start_new_session=True
    )
    try:
        wait_until_ready(
            f"{base_url}/readyz",
            alive=lambda: server.poll() is None,
            timeout=ENGINE_START_TIMEOUT_S,
            http=http,
        )
        yield server
    finally:
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(timeout=90) == 0


ADMIN_TOKEN = "lgw-admin-test-token"


def long_stream(model: str) -> dict[str, Any]:
    """A streamed chat request that runs far longer than any test waits for it."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Count from 1 to 1000, comma separated."}],
        "max_tokens": 900,
        "temperature": 0,
        "stream": True,
    }


def make_settings(state_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test gateway: float32 (exact), small, on a free port,
    with its own store in ``state_dir``."""
    defaults: dict[str, Any] = {
        "dtype": "float32",
        "max_model_len": MAX_MODEL_LEN,
        "kv_cache_gib": 1,
        "database_url": f"sqlite+aiosqlite:///{state_dir / 'gateway.db'}",
        "admin_token": ADMIN_TOKEN,
        "port": free_port(),
    }
    return Settings(_env_file=None, **{**defaults, **overrides})  # type: ignore[call-arg]
