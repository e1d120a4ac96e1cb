"""The ASGI app class: FastAPI, with streamed events sent straight to the server."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and all(
            getattr(middleware.cls, "passes_bodies_through", False)
            for middleware in self.user_middleware
        ):
            scope[SERVER_SEND] = send
        await super().__call__(scope, receive, send)
