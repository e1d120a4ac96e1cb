"""The HTTP server: uvicorn, which stops when the engine is gone, with an exit that cannot hang.

A gateway whose engine died (its engine core process killed, out of memory...) can only answer
503: :class:`GuardedServer` checks the engine every ``WATCH_SECONDS`` and, once it is dead,
stops the server (in-flight requests end with their error, the stores are closed) and the
process exits with ``ENGINE_DEAD`` (4), so that systemd or Kubernetes starts a new one. An
engine that failed to start (a model that cannot load, the isolation fix unavailable) stops it
the same way with uvicorn's ``STARTUP_FAILURE`` (3).

Once the server has shut down (connections drained, the lifespan's engine and stores
closed), the process should end at once. If something still holds it, such as a thread a
library left running, :class:`GuardedServer` writes every thread's stack to stderr and exits
with status 1 after ``EXIT_DEADLINE_SECONDS``: an orchestrator sees a failed stop with its
cause, not a process that hangs until it is killed.

Connections are served by :class:`~app.connections.GuardedHttpProtocol` (uvicorn's httptools
protocol with deadlines and caps, app/connections), from a listener :class:`GuardedServer`
opens itself: uvicorn's passes neither the protocol its shared counts nor asyncio's TLS
handshake timeout.
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

from app.connections import ConnectionGuard, ConnectionLimits, GuardedHttpProtocol
from app.connections.admission import default_max_connections, descriptor_limit, parse_networks
from app.errors import EngineUnavailableError
from app.settings import Settings

logger = logging.getLogger(__name__)

EXIT_DEADLINE_SECONDS = 30.0
WATCH_SECONDS = 1.0
ENGINE_DEAD = 4


class GuardedServer(uvicorn.Server):
    """uvicorn's server, watching the gateway's engine (``app.state.gateway``, once the
    lifespan has made it); ``exit_status`` is what the process should exit with. With
    ``limits``, its connections are held to them (``guard`` counts them)."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: FastAPI | None = None,
        *,
        limits: ConnectionLimits | None = None,
    ) -> None:
        super().__init__(config)
        self._app = app
        self.exit_status = 0
        self.guard = ConnectionGuard(limits) if limits is not None else None

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

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        guard = self.guard
        if guard is None or sockets is not None:  # no limits, or a supervisor's sockets
            await super().startup(sockets)
            return
        # uvicorn's start-up with no socket to listen on (the lifespan, the server's state),
        # then the listener, opened here: started once it listens.
        await super().startup(sockets=[])
        self.started = False
        config = self.config

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return GuardedHttpProtocol(
                config, self.server_state, self.lifespan.state, _loop, guard=guard
            )

        try:
            server = await asyncio.get_running_loop().create_server(
                create_protocol,
                host=config.host,
                port=config.port,
                ssl=config.ssl,
                backlog=config.backlog,
                # asyncio's default is 60 s, for every connection that stalls its handshake.
                ssl_handshake_timeout=guard.limits.tls_handshake_timeout if config.ssl else None,
            )
        except OSError as exc:  # as uvicorn's own listener fails
            logger.error(exc)
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)
        self.servers.append(server)
        self._log_started_message(list(server.sockets))
        self.started = True

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
                backend = gateway.backend
            except EngineUnavailableError:
                if gateway.startup_error is not None:
                    self.fail(
                        STARTUP_FAILURE, f"the gateway failed to start: {gateway.startup_error}"
                    )
                continue  # still starting
            if not started:
                started = True
                freeze_startup_objects()
            try:
                await backend.check_alive()
            except EngineUnavailableError:
                self.fail(ENGINE_DEAD, "the inference engine died")


def freeze_startup_objects() -> None:
    """Keep what start-up built (vLLM, torch, the tokenizer: it lives as long as the process)
    out of the garbage collector's generations, as vLLM's own server does after start-up: a
    full collection walking it costs hundreds of milliseconds of the event loop's time."""
    gc.collect()
    gc.freeze()


def connection_limits(settings: Settings) -> ConnectionLimits:
    """The limits every client connection is held to (app/connections), from ``settings``."""
    try:
        trusted_proxies = parse_networks(settings.trusted_proxies)
    except ValueError as exc:
        raise ValueError(f"trusted_proxies: {exc}") from exc
    reserve = settings.connection_probe_reserve
    limits = ConnectionLimits(
        head_timeout=settings.request_head_timeout_seconds,
        max_head_bytes=settings.max_request_head_bytes,
        body_min_rate=settings.request_body_min_bytes_per_second,
        body_rate_window=settings.request_body_rate_window_seconds,
        write_timeout=settings.response_write_timeout_seconds,
        tls_handshake_timeout=settings.tls_handshake_timeout_seconds,
        max_connections=settings.max_connections or default_max_connections(reserve),
        probe_reserve=reserve,
        max_per_source=settings.max_connections_per_source,
        trusted_proxies=trusted_proxies,
    )
    if limits.max_connections + reserve >= descriptor_limit():
        logger.warning(
            "max_connections (%d) + connection_probe_reserve (%d) reach the open-file limit "
            "(%d): raise it (LimitNOFILE in the systemd unit) or lower them",
            limits.max_connections,
            reserve,
            descriptor_limit(),
        )
    return limits


def server_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    """uvicorn's configuration for serving ``app`` (with :class:`GuardedServer` and
    :func:`connection_limits`)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        log_level=settings.log_level,
        # uvicorn's loggers write through the process's handler (app/access_log.py's
        # configure: text or JSON), and the gateway's access line replaces uvicorn's.
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
        # The parser GuardedHttpProtocol extends (llhttp refuses request smuggling's shapes).
        http="httptools",
        # No route is a WebSocket: an upgraded connection would leave the guarded protocol.
        ws="none",
        # The client address the app sees (logs, audit) is trusted as the caps trust it.
        forwarded_allow_ips=[str(net) for net in parse_networks(settings.trusted_proxies)],
    )


def run(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM; exit with status 3 if it (or its engine) could
    not start, 4 if its engine died."""
    limits = connection_limits(settings)
    server = GuardedServer(server_config(app, settings), app, limits=limits)
    # SIGINT, which uvicorn raises again once it has shut down, is the stop asked for.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
    if server.exit_status:
        sys.exit(server.exit_status)
