"""uvicorn's httptools protocol, held to :class:`~app.connections.admission.ConnectionLimits`.

A request head must arrive complete within ``head_timeout`` and fit in ``max_head_bytes``
(else 408 or 431, and the connection closed); a body being read must keep up
``body_min_rate`` over each ``body_rate_window``; a response the client leaves unread for
``write_timeout`` aborts the connection, which the handler sees as a client gone; a
:class:`~app.connections.admission.ConnectionGuard` admits connections and forwarded
requests. httptools refuses request-smuggling framing that h11 accepts, which is why the
gateway pins this protocol, and WebSockets are off (``ws="none"``). The attacks each limit
answers: docs/reliability.md, "Abuse in front of the engine".
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from app.connections import refusals
from app.connections.admission import PROBE_PATHS, Admission, ConnectionGuard, source_key
from app.connections.refusals import Refusal


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        guard: ConnectionGuard,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.guard = guard
        self.limits = guard.limits
        self._peer = ""
        self._trusted_peer = False
        self._admission: Admission | None = None
        # The head: from the parser's first byte of a request to its headers' end.
        self._head_in_progress = False
        self._head_began_in_this_feed = False
        self._head_bytes = 0
        self._head_deadline: asyncio.TimerHandle | None = None
        # The body: from the headers' end to the message's.
        self._body_in_progress = False
        self._body_bytes = 0
        self._body_check: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        # Requests a trusted proxy forwarded, with the client each counts against.
        self._forwarded: list[tuple[RequestResponseCycle, str]] = []

    # -- connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._peer = source_key(self.client[0]) if self.client else ""
        self._trusted_peer = self.guard.is_trusted_proxy(self._peer)
        admission = self.guard.admit(self._peer)
        if admission is Admission.SERVER_FULL:
            self._close_with(refusals.server_full())
        elif admission is Admission.SOURCE_FULL:
            self._close_with(refusals.source_full(self.limits.max_per_source))
        else:
            self._admission = admission
            self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_deadline, self._body_check, self._write_deadline):
            if timer is not None:
                timer.cancel()
        if self._admission is not None:
            self.guard.leave(self._peer)
            self._admission = None
        for _, source in self._forwarded:
            self.guard.leave_forwarded(source)
        self._forwarded.clear()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._head_began_in_this_feed = False
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._head_in_progress:
            # Only whole reads inside one head count: a read where the head began may hold
            # the previous request's body, so the cap can be passed by at most one read.
            if not self._head_began_in_this_feed:
                self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes:
                self.guard.refused(
                    "head too large",
                    "closing connections whose request head passed %d bytes",
                    self.limits.max_head_bytes,
                )
                self._close_with(refusals.head_too_large(self.limits.max_head_bytes))
                return
        if self._body_in_progress and self._body_check is None:
            self._body_check = self.loop.call_later(
                self.limits.body_rate_window, self._check_body_rate
            )

    # -- the writing side ------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(
                self.limits.write_timeout, self._write_stalled
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_stalled(self) -> None:
        self._write_deadline = None
        self.guard.refused(
            "write timeout",
            "closing connections whose client did not read the response for %g s",
            self.limits.write_timeout,
        )
        # Closing would wait for the unread buffer to be sent: it never would be.
        self.transport.abort()

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_in_progress = True
        self._head_began_in_this_feed = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_in_progress = False
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        refusal, source = self._admit_request()
        if refusal is None:
            super().on_headers_complete()
            if self._admission is Admission.PROBES_ONLY:
                self.cycle.keep_alive = False  # its connection is over the cap: one probe
            if source is not None:
                self._forwarded.append((self.cycle, source))
        else:
            # As uvicorn refuses over its limit_concurrency: the request's cycle runs another
            # app, which answers and closes (the parser goes on reading what follows).
            app, self.app = self.app, refusal
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        self._body_in_progress = True
        self._body_bytes = 0

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_bytes += len(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._body_in_progress = False
        if self._body_check is not None:
            self._body_check.cancel()
            self._body_check = None
        if self.cycle.response_complete:  # answered before its body was all in
            self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        finished = [(cycle, source) for cycle, source in self._forwarded if cycle.response_complete]
        for entry in finished:
            self._forwarded.remove(entry)
            self.guard.leave_forwarded(entry[1])
        if not self._body_in_progress and self.cycle.response_complete:
            self._arm_head_deadline()  # no pipelined request was waiting: the next head's

    # -- limits ----------------------------------------------------------------------------

    def _admit_request(self) -> tuple[Refusal | None, str | None]:
        """A refusal for the request whose head just ended, or the forwarded client it
        counts against (a trusted proxy's request)."""
        if self._admission is Admission.PROBES_ONLY:
            path = httptools.parse_url(self.url).path.decode("latin-1")
            if path not in PROBE_PATHS:
                return refusals.server_full(), None
        if not self._trusted_peer:
            return None, None
        forwarded_for = (value for name, value in self.headers if name == b"x-forwarded-for")
        source = self.guard.forwarded_client(self._peer, forwarded_for)
        if not self.guard.enter_forwarded(source):
            return refusals.source_full(self.limits.max_per_source), None
        return None, source

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        if not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(
                self.limits.head_timeout, self._head_timed_out
            )

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        self.guard.refused(
            "head timeout",
            "closing connections whose request head did not arrive within %g s",
            self.limits.head_timeout,
        )
        # An idle connection is closed as a keep-alive timeout would; a head begun, answered.
        self._close_with(
            refusals.head_timeout(self.limits.head_timeout) if self._head_in_progress else None
        )

    def _check_body_rate(self) -> None:
        self._body_check = None
        if not self._body_in_progress or self.transport.is_closing():
            return
        # Not the client's fault: the app has not read what came (reading is paused), or
        # the client waits for the 100 Continue the app's first read sends.
        waiting_for_us = self.flow.read_paused or self.cycle.waiting_for_100_continue
        limits = self.limits
        if not waiting_for_us and self._body_bytes < limits.body_min_rate * limits.body_rate_window:
            self.guard.refused(
                "slow body",
                "closing connections whose request body came slower than %d bytes/s",
                limits.body_min_rate,
            )
            self._close_with(refusals.body_too_slow(limits.body_min_rate, limits.body_rate_window))
            return
        self._body_bytes = 0
        self._body_check = self.loop.call_later(limits.body_rate_window, self._check_body_rate)

    def _close_with(self, refusal: Refusal | None) -> None:
        """Answer ``refusal`` unless a response is under way, end the request, close."""
        cycle: RequestResponseCycle | None = self.cycle
        idle = cycle is None or cycle.response_complete or not cycle.response_started
        if refusal is not None and idle:
            self.transport.write(refusal.raw(self.server_state.default_headers))
        if cycle is not None and not cycle.response_complete:
            # Its handler reads a disconnect and its later writes go nowhere.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()
