"""The HTTP server: uvicorn, with an exit that cannot hang.

Once the server has shut down (connections drained, the lifespan's engine and stores
closed), the process should end at once. If something still holds it, such as a thread a
library left running, :class:`GatewayServer` writes every thread's stack to stderr and exits
with status 1 after ``EXIT_DEADLINE_SECONDS``: an orchestrator sees a failed stop with its
cause, not a process that hangs until it is killed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import socket
import sys

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from app.settings import Settings

EXIT_DEADLINE_SECONDS = 30.0


class GatewayServer(uvicorn.Server):
    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            # Covers what follows the server: the event loop's teardown (tasks still
            # pending, executor threads) and the interpreter's (non-daemon threads).
            faulthandler.dump_traceback_later(EXIT_DEADLINE_SECONDS, exit=True)


def run(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM; exit with status 3 if it could not start."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )
    server = GatewayServer(config)
    # SIGINT, which uvicorn raises again once it has shut down, is the stop asked for.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
