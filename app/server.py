"""The HTTP server: uvicorn, which stops when the engine is gone, with an exit that cannot hang.

A gateway whose engine died (its engine core process killed, out of memory...) can only answer
503: :class:`GatewayServer` checks the engine every ``WATCH_SECONDS`` and, once it is dead,
stops the server (in-flight requests end with their error, the stores are closed) and the
process exits with ``ENGINE_DEAD`` (4), so that systemd or Kubernetes starts a new one. An
engine that failed to start (a model that cannot load, the isolation fix unavailable) stops it
the same way with uvicorn's ``STARTUP_FAILURE`` (3).

Once the server has shut down (connections drained, the lifespan's engine and stores
closed), the process should end at once. If something still holds it, such as a thread a
library left running, :class:`GatewayServer` writes every thread's stack to stderr and exits
with status 1 after ``EXIT_DEADLINE_SECONDS``: an orchestrator sees a failed stop with its
cause, not a process that hangs until it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import socket
import sys

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from app.errors import EngineUnavailableError
from app.settings import Settings

logger = logging.getLogger(__name__)

EXIT_DEADLINE_SECONDS = 30.0
WATCH_SECONDS = 1.0
ENGINE_DEAD = 4


class GatewayServer(uvicorn.Server):
    """uvicorn's server, watching the gateway's engine (``app.state.gateway``, once the
    lifespan has made it); ``exit_status`` is what the process should exit with."""

    def __init__(self, config: uvicorn.Config, app: FastAPI | None = None) -> None:
        super().__init__(config)
        self._app = app
        self.exit_status = 0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        watchdog = asyncio.create_task(self._watch_engine()) if self._app is not None else None
        try:
            await super().serve(sockets)
        finally:
            # Covers what follows the server: the event loop's teardown (tasks still
            # pending, executor threads) and the interpreter's (non-daemon threads).
            faulthandler.dump_traceback_later(EXIT_DEADLINE_SECONDS, exit=True)
            if watchdog is not None:
                watchdog.cancel()

    def fail(self, status: int, reason: str) -> None:
        """Stop serving, then exit with ``status``."""
        logger.critical("%s: stopping the server, to exit with status %d", reason, status)
        self.exit_status = status
        self.should_exit = True

    async def _watch_engine(self) -> None:
        started = False
        while not self.should_exit:
            await asyncio.sleep(WATCH_SECONDS)
            gateway = getattr(self._app.state, "gateway", None) if self._app else None
            if gateway is None:
                continue
            try:
                # The front role has no engine: it has started once its front is in place.
                engine = gateway.engine if gateway.settings.role != "front" else gateway.front
            except EngineUnavailableError:
                if gateway.startup_error is not None:
                    # In the front role what failed is its tokenizer or upstream client.
                    self.fail(
                        STARTUP_FAILURE, f"the gateway failed to start: {gateway.startup_error}"
                    )
                continue  # still starting
            if not started:
                started = True
                freeze_startup_objects()
            if gateway.settings.role == "front":
                continue
            try:
                await engine.check_health()
            except EngineUnavailableError:
                self.fail(ENGINE_DEAD, "the inference engine died")


def freeze_startup_objects() -> None:
    """Keep what start-up built (vLLM, torch, the tokenizer: it lives as long as the process)
    out of the garbage collector's generations, as vLLM's own server does after start-up: a
    full collection walking it costs hundreds of milliseconds of the event loop's time."""
    gc.collect()
    gc.freeze()


def run(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM; exit with status 3 if it (or its engine) could
    not start, 4 if its engine died."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )
    server = GatewayServer(config, app)
    # SIGINT, which uvicorn raises again once it has shut down, is the stop asked for.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
    if server.exit_status:
        sys.exit(server.exit_status)
