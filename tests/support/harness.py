"""The one way tests start the app: ``create_app(settings, engine_factory=...)`` served by
uvicorn on loopback, over a scripted engine (the serving tests, the fuzz suite), as a front
over any upstream (no engine), or on the real vLLM engine (the e2e suite).

:func:`serve` runs it on the test's event loop; :func:`serve_on_thread` on a thread with an
event loop of its own (or on another app's loop), for tests that call it from synchronous
code such as the official ``openai`` client. The edge tests enter the same app's lifespan
and drive it over ASGI instead (tests/support/edge_app.py), to see how much of a body the
app read."""

from __future__ import annotations

import asyncio
import atexit
import functools
import io
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.engine.base import Engine
from app.gateway import Gateway
from app.main import create_app
from app.metrics import flush_held, render
from app.serving.in_process.backend import EngineFactory, start_vllm_engine
from app.settings import Settings
from app.store.db import open_database
from app.store.tables import UsageRow
from tests.support.servers import PromptServer, free_port, wait_until_ready
from tests.support.startup_sharing import share_startup_work

ADMIN_TOKEN = "lgw-admin-test-token"
ADMIN_TIMEOUT_S = 60
"""An admin call's deadline in tests. httpx's 5-second default would be a latency assertion
no test means, and a registration on 2 cores shared with two engines can exceed it."""


def admin_client_options(base_url: str) -> dict[str, Any]:
    """What a test's httpx client for the admin API of the app at ``base_url`` opens with."""
    return {
        "base_url": f"{base_url}/admin/v1",
        "headers": {"Authorization": f"Bearer {ADMIN_TOKEN}"},
        "timeout": ADMIN_TIMEOUT_S,
    }


ServerFactory = Callable[[FastAPI, Settings], uvicorn.Server]


def app_settings(state_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test app: its store and adapters in ``state_dir`` (shared by apps given
    the same one: replicas), the test admin token, a free port, no ``.env``. A new SQLite
    store starts as a copy of one already migrated: the app finds it at the latest revision
    (migrating each test's store anew took most of a scripted app's start)."""
    store = state_dir / "gateway.db"
    defaults: dict[str, Any] = {
        "database_url": f"sqlite+aiosqlite:///{store}",
        "adapter_root": state_dir / "adapters",
        "admin_token": ADMIN_TOKEN,
        "port": free_port(),
    }
    if "database_url" not in overrides and not store.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_store(), store)
    return Settings(_env_file=None, **{**defaults, **overrides})


@functools.cache
def migrated_store() -> Path:
    """A SQLite store at the latest revision, migrated once per process (on a thread of its
    own: the caller may be on an event loop) and removed at exit."""
    directory = Path(tempfile.mkdtemp(prefix="migrated-store-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = directory / "gateway.db"

    async def migrate() -> None:
        async with open_database(f"sqlite+aiosqlite:///{path}"):
            pass

    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, migrate()).result()
    return path


def scripted(engine: Engine) -> EngineFactory:
    """An engine factory that hands the app ``engine`` (and leaves it running)."""

    @asynccontextmanager
    async def factory(_: Settings) -> AsyncIterator[Engine]:
        yield engine

    return factory


@dataclass
class RunningApp:
    """An app served on loopback, and what tests read of it beside its HTTP answers."""

    base_url: str
    app: FastAPI

    @property
    def gateway(self) -> Gateway:
        gateway: Gateway = self.app.state.gateway
        return gateway

    @property
    def settings(self) -> Settings:
        return self.gateway.settings

    @property
    def metrics_dir(self) -> Path:
        directory: Path = self.app.state.metrics_dir
        return directory

    def samples(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` with ``labels`` in the app's /metrics (called on
        the app's event loop, as /metrics writes what the request path holds first)."""
        flush_held()
        body, _ = render(self.metrics_dir)
        return sum(
            sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One admin API call, which must succeed; its JSON answer."""
        async with httpx.AsyncClient(**admin_client_options(self.base_url)) as admin:
            response = await admin.request(method, path, json=body)
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    async def usage_records(self) -> list[UsageRow]:
        await self.gateway.ledger.flush()
        async with self.gateway.sessions() as session:
            return list((await session.scalars(select(UsageRow).order_by(UsageRow.id))).all())

    async def settled(self, timeout: float = 60.0) -> None:
        """Wait for the requests that have ended to let go of their adapters, and for the
        reconciliations handed to the background (``timeout`` bounds only a hang): a client
        may read a stream's end before its request has settled."""
        for _ in range(int(timeout / 0.01)):
            if self.gateway.tracker.in_flight.idle and not self.gateway._tasks:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("background work did not finish")


def uvicorn_server(app: FastAPI, settings: Settings) -> uvicorn.Server:
    return PromptServer(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    )


def _listening(settings: Settings, server: uvicorn.Server) -> list[socket.socket] | None:
    """The socket a :class:`PromptServer` is to serve on, bound to ``settings.port`` now,
    before the app's start-up: uvicorn binds its own only after the lifespan's start-up, and
    for that long (a tenth of a second, more on a busy machine) the port ``free_port`` picked
    would stay free for another test process to be given. ``None`` for other servers, which
    bind their own (``GuardedServer`` guards only the sockets it binds)."""
    if not isinstance(server, PromptServer):
        return None
    listener = socket.create_server(("127.0.0.1", settings.port))
    # Its connections without Nagle's algorithm, as asyncio's own listeners' are: it sets
    # TCP_NODELAY only on sockets made for IPPROTO_TCP, and this one's protocol is 0. Else a
    # response written in two parts waits for the client's delayed ACK (40 ms on Linux) on
    # every request of a kept-alive connection.
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return [listener]


@asynccontextmanager
async def serve(
    settings: Settings,
    engine_factory: EngineFactory = start_vllm_engine,
    *,
    ready: str = "/readyz",
    timeout: float = 60,
    server_factory: ServerFactory = uvicorn_server,
) -> AsyncIterator[RunningApp]:
    """Serve ``create_app(settings, engine_factory=...)`` on the running event loop until the
    block ends, once ``ready`` answers 200. What its start-up shares with the process's
    other apps: tests/support/startup_sharing.py."""
    share_startup_work()
    app = create_app(settings, engine_factory=engine_factory)
    server = server_factory(app, settings)
    sockets = _listening(settings, server)
    task = asyncio.create_task(server.serve(sockets))
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        # Listening once started (its lifespan's start-up done): polled here, every few ms,
        # rather than by requests from a thread every 20 ms, the most of an app's start.
        deadline = time.monotonic() + timeout
        while not server.started and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        await asyncio.to_thread(
            wait_until_ready, f"{base_url}{ready}", alive=lambda: not task.done(), timeout=timeout
        )
        yield RunningApp(base_url, app)
    finally:
        server.should_exit = True
        try:
            await task
        finally:
            for sock in sockets or []:
                sock.close()  # closed with the server, unless its start-up failed first


def _stuck(server: uvicorn.Server, loop: asyncio.AbstractEventLoop) -> str:
    """What a server that does not stop is waiting for: its connections and tasks, the stacks
    of the loop's tasks and of every thread."""
    state = server.server_state
    lines = [f"connections: {len(state.connections)}, tasks: {len(state.tasks)}"]

    async def tasks() -> list[str]:
        described = []
        for task in asyncio.all_tasks():
            stream = io.StringIO()
            task.print_stack(file=stream)
            described.append(f"{task!r}\n{stream.getvalue()}")
        return described

    try:
        lines += asyncio.run_coroutine_threadsafe(tasks(), loop).result(timeout=5)
    except TimeoutError:
        lines.append("the loop does not answer")
    for thread_id, frame in sys._current_frames().items():
        lines.append(f"thread {thread_id}:\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(lines)


@contextmanager
def serve_on_thread(
    settings: Settings,
    engine_factory: EngineFactory = start_vllm_engine,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    timeout: float = 60,
) -> Iterator[tuple[RunningApp, asyncio.AbstractEventLoop]]:
    """Serve ``create_app(settings, engine_factory=...)`` until the block ends, on ``loop``
    (another app's, which keeps running) or on a thread with a loop of its own; yields the app
    and the loop it serves on, the only one that may call its engine. What its start-up
    shares with the process's other apps: tests/support/startup_sharing.py."""
    share_startup_work()
    app = create_app(settings, engine_factory=engine_factory)
    server = uvicorn_server(app, settings)
    sockets = _listening(settings, server)
    own_loop = loop is None
    loop = loop or asyncio.new_event_loop()
    serving = asyncio.run_coroutine_threadsafe(server.serve(sockets), loop)
    thread = threading.Thread(target=loop.run_forever, name="gateway", daemon=True)
    if own_loop:
        thread.start()
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_until_ready(f"{base_url}/readyz", alive=lambda: not serving.done(), timeout=timeout)
        yield RunningApp(base_url, app), loop
    finally:
        server.should_exit = True
        try:
            serving.result(timeout=120)
        except TimeoutError:
            raise AssertionError(f"the server did not stop:\n{_stuck(server, loop)}") from None
        finally:
            for sock in sockets or []:
                sock.close()
        if own_loop:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
