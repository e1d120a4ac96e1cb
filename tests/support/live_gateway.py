"""The end-to-end suite's gateways: the harness (tests/support/harness.py) on the real vLLM
engine with the embedded model, on a thread of their own (:func:`running_gateway`) or borrowing
another's engine (:func:`borrowing_gateway`); and the settings and store set-up they share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai

from app.cli import apply_tenants, create_key, register_adapter
from app.engine.base import Engine
from app.serving.in_process.backend import EngineFactory, start_vllm_engine
from app.settings import Settings
from tests.support.harness import RunningApp, admin_client_options, app_settings, serve_on_thread

T = TypeVar("T")

ENGINE_START_TIMEOUT_S = 600
MAX_MODEL_LEN = 1024


@dataclass
class LiveGateway(RunningApp):
    """A gateway on the real engine, served on an event loop of its own."""

    keys: dict[str, str] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    """The event loop the gateway serves on: the engine's, which only it may call."""

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run ``work`` on the gateway's event loop, from the test's thread."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    @property
    def engine(self) -> Engine:
        return self.gateway.backend.engine  # type: ignore[attr-defined,no-any-return]

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.keys[tenant], max_retries=0
        )

    def async_client(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.keys[tenant], max_retries=0
        )

    def admin_client(self) -> httpx.Client:
        return httpx.Client(**admin_client_options(self.base_url))

    def wait_idle(self, timeout: float = 60.0) -> int:
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
    with serve_on_thread(settings, engine_factory, timeout=start_timeout) as (running, loop):
        yield LiveGateway(running.base_url, running.app, keys, loop)


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

    with serve_on_thread(settings, lent, loop=host.loop) as (running, loop):
        yield LiveGateway(running.base_url, running.app, {}, loop)


def borrowed_settings(host: LiveGateway, state_dir: Path, **overrides: Any) -> Settings:
    """Settings for a gateway borrowing ``host``'s engine (:func:`borrowing_gateway`), with a
    store of its own in ``state_dir`` (shared by gateways given the same one)."""
    engine = {name: getattr(host.settings, name) for name in ENGINE_FIELDS}
    return make_settings(state_dir, **{**engine, **overrides})


async def forget_adapters(engine: Engine) -> None:
    """Remove every adapter from vLLM's caches (its LoRA ids are a store's row ids)."""
    llm = engine._llm  # type: ignore[attr-defined]
    for lora_id in await llm.list_loras():
        await llm.remove_lora(lora_id)


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
    """Settings for a gateway on the real engine: float32 (exact), small, on a free port,
    with its own store in ``state_dir``."""
    engine = {"dtype": "float32", "max_model_len": MAX_MODEL_LEN, "kv_cache_gib": 1}
    # The demo adapters `make adapters` trained, where `make serve` finds them.
    adapters = {"adapter_root": Settings.model_fields["adapter_root"].default}
    return app_settings(state_dir, **{**engine, **adapters, **overrides})
