"""The ASGI app class: FastAPI, with streamed events sent straight to the server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

SERVER_SEND = "lora_gateway.server_send"
"""The scope key of the server's own ``send``, where every layer between it and the
routes passes response bodies through unchanged (see :class:`StreamingApp`)."""


class StreamingApp(FastAPI):
    """FastAPI, with streamed events sent straight to the server.

    Every layer between the server and a route wraps ``send`` to look at the response's
    start only: Starlette's error handling (twice, and once more per route), the request
    id. For a stream, each token would pay for that chain of calls to reach the server
    unchanged. So where every middleware says it passes bodies through
    (``passes_bodies_through``), the server's ``send`` is kept in the scope, and
    :class:`EventStreamResponse` sends its events there once its start has gone through the
    chain. One middleware that does not say so (one that compresses or rewrites bodies)
    turns this off for the whole app: it is never bypassed.
    """

    _bypassable: bool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._bypassable is None:  # the middleware are fixed once the app has started
            self._bypassable = all(
                getattr(middleware.cls, "passes_bodies_through", False)
                for middleware in self.user_middleware
            )
        if scope["type"] == "http" and self._bypassable:
            scope[SERVER_SEND] = send
        await super().__call__(scope, receive, send)


BodyWriter = Callable[[bytes], Awaitable[None]]
"""``await write(part)``: one more part of a started response's body."""


def body_writer(send: Send) -> BodyWriter:
    """How to send the parts of a response body whose start ``send`` has sent.

    Through ``send`` as ``http.response.body`` messages; but where ``send`` is uvicorn's own
    (its httptools server, as the gateway runs) and the response is chunked, each part is
    framed and written to the connection directly, byte for byte as uvicorn's ``send``
    would, with its flow control and its end of a connection gone: a streamed token pays for
    one write, not for a message and the checks around it. Anything else (the end of the
    body, a server's ``send`` of another kind) goes through ``send``."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle or not _chunked_and_started(cycle):

        async def through(part: bytes) -> None:
            await send({"type": "http.response.body", "body": part, "more_body": True})

        return through

    transport, flow = cycle.transport, cycle.flow

    async def direct(part: bytes) -> None:
        if flow.write_paused and not cycle.disconnected:
            await flow.drain()
        if cycle.disconnected or not part:
            return
        if cycle.response_complete:  # uvicorn's own error
            await send({"type": "http.response.body", "body": part, "more_body": True})
            return
        transport.write(b"%x\r\n%b\r\n" % (len(part), part))

    return direct


def _chunked_and_started(cycle: RequestResponseCycle) -> bool:
    return bool(
        cycle.response_started and cycle.chunked_encoding and cycle.scope["method"] != "HEAD"
    )
