"""The server process exits once it has shut down, even when a thread would hold it."""

from __future__ import annotations

import asyncio
import gc
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import uvicorn
from fastapi import FastAPI

from app import server
from tests.support.servers import free_port, wait_until_ready

# A gateway-shaped app: its lifespan's shutdown leaves a thread behind when told to.
SERVER = textwrap.dedent(
    """
    import sys, threading
    from contextlib import asynccontextmanager
    from fastapi import FastAPI
    from app import server
    from app.settings import Settings

    server.EXIT_DEADLINE_SECONDS = {deadline}

    def held_forever():
        threading.Event().wait()

    @asynccontextmanager
    async def lifespan(app):
        yield
        if sys.argv[2] == "leave-a-thread":
            threading.Thread(target=held_forever).start()  # not a daemon: holds the exit

    app = FastAPI(lifespan=lifespan)
    server.run(app, Settings(_env_file=None, port=int(sys.argv[1]), log_level="warning"))
    """
)
# Its clock starts once the server has shut down, the held thread already started: a short
# one is enough for any machine's load.
DEADLINE_SECONDS = 1.0


def serve_then_interrupt(how: str, deadline: float = DEADLINE_SECONDS) -> tuple[int, str, float]:
    """Start the server (exit deadline ``deadline``), stop it with SIGINT once it answers; its
    exit status, its stderr and the seconds from the signal to its exit."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER.format(deadline=deadline), str(port), how],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/openapi.json"
        wait_until_ready(url, alive=lambda: process.poll() is None, timeout=30)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        _, stderr = process.communicate(timeout=30)
        return process.returncode, stderr, time.monotonic() - interrupted
    finally:
        process.kill()


def test_a_clean_shutdown_exits_before_the_deadline() -> None:
    # Exiting at the deadline is status 1 with every thread's stack (below): a clean exit's 0
    # and no stack are the verdict, whatever a busy machine makes the shutdown take.
    status, stderr, _ = serve_then_interrupt("clean", deadline=60.0)
    assert status == 0, stderr
    assert "Thread" not in stderr


def test_a_thread_left_running_cannot_hold_the_process() -> None:
    status, stderr, seconds = serve_then_interrupt("leave-a-thread")
    assert status == 1
    assert seconds >= DEADLINE_SECONDS  # held to the deadline; the exit is bounded by a hang
    assert "in held_forever" in stderr  # every thread's stack, the culprit's among them


# A gateway-shaped app whose backend dies (or never starts) once it is serving.
DYING = textwrap.dedent(
    """
    import asyncio, sys, time
    from contextlib import asynccontextmanager
    from types import SimpleNamespace
    from fastapi import FastAPI
    from app import server
    from app.errors import EngineUnavailableError
    from app.settings import Settings

    server.WATCH_SECONDS = 0.1
    started = time.monotonic()

    class Backend:
        async def check_alive(self):
            if time.monotonic() - started > 1.0:
                raise EngineUnavailableError("The inference engine is not running.")

    class Gateway:
        startup_error = "RuntimeError: no model" if sys.argv[2] == "never-starts" else None

        @property
        def backend(self):
            if self.startup_error is not None:
                raise EngineUnavailableError("The inference engine failed to start.")
            return Backend()

    @asynccontextmanager
    async def lifespan(app):
        app.state.gateway = Gateway()
        yield

    app = FastAPI(lifespan=lifespan)
    server.run(app, Settings(_env_file=None, port=int(sys.argv[1]), log_level="warning"))
    """
)


def serve_until_it_stops(how: str) -> tuple[int, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", DYING, str(port), how], stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = process.communicate(timeout=30)
        return process.returncode, stderr
    finally:
        process.kill()


def test_a_dead_engine_stops_the_server_with_a_failure_status() -> None:
    status, stderr = serve_until_it_stops("dies")
    assert status == 4, stderr
    assert "the inference engine died" in stderr


def test_an_engine_that_failed_to_start_stops_the_server() -> None:
    status, stderr = serve_until_it_stops("never-starts")
    assert status == 3, stderr
    assert "the gateway failed to start: RuntimeError: no model" in stderr


async def test_once_started_what_start_up_built_is_kept_out_of_garbage_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Backend:
        async def check_alive(self) -> None:
            return None

    app = FastAPI()
    app.state.gateway = SimpleNamespace(backend=Backend(), startup_error=None)
    built = {"by start-up": [app]}  # in the collector's generations until frozen
    assert any(tracked is built for tracked in gc.get_objects())
    frozen = gc.get_freeze_count()
    watched = server.GuardedServer(uvicorn.Config(app), app)
    monkeypatch.setattr(server, "WATCH_SECONDS", 0.01)
    # Left frozen, as the app leaves it: unfreezing would hand what this test process froze
    # after its collection (tests/conftest.py) back to every later collection's walk.
    watchdog = asyncio.create_task(watched._watch_engine())
    try:
        for _ in range(500):
            if gc.get_freeze_count() > frozen:
                break
            await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > frozen
        assert not any(tracked is built for tracked in gc.get_objects())
    finally:
        watchdog.cancel()
