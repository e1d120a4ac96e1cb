"""The answers the connection limits give: OpenAI's error shape, and the connection closed.

A refusal is written either straight to the socket (before any request was read, or in
place of one whose head or body never came), or run as the ASGI app of a request whose head
is complete, so that uvicorn's own request cycle writes it and then closes the connection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus

from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str
    error_type: str = "invalid_request_error"
    # Seconds; for refusals by load, which a retry may not meet.
    retry_after: int | None = None

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.error_type, "param": None}
        return json.dumps({"error": {**error, "code": self.code}}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body())).encode()),
            # The client may still be sending: what follows on this connection is not read.
            (b"connection", b"close"),
        ]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        return headers

    def raw(self, default_headers: list[tuple[bytes, bytes]]) -> bytes:
        """The whole response, for writing to the socket outside a request cycle."""
        lines = [f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}".encode()]
        lines += [name + b": " + value for name, value in [*default_headers, *self.headers()]]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body()

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        await send(
            {"type": "http.response.start", "status": self.status, "headers": self.headers()}
        )
        await send({"type": "http.response.body", "body": self.body(), "more_body": False})


def head_timeout(seconds: float) -> Refusal:
    return Refusal(408, "request_timeout", f"The request head did not arrive within {seconds:g} s.")


def body_too_slow(bytes_per_second: int, window: float) -> Refusal:
    return Refusal(
        408,
        "request_timeout",
        f"The request body arrived slower than {bytes_per_second} bytes per second "
        f"over {window:g} s.",
    )


def head_too_large(limit: int) -> Refusal:
    return Refusal(
        431, "request_head_too_large", f"The request line and headers exceed {limit} bytes."
    )


def source_full(limit: int) -> Refusal:
    return Refusal(
        429,
        "too_many_connections",
        f"This client address already holds {limit} connections (or requests, through a "
        "proxy); close some first.",
        error_type="requests",
        retry_after=1,
    )


def server_full() -> Refusal:
    return Refusal(
        503,
        "too_many_connections",
        "The server holds as many connections as it accepts; retry shortly.",
        error_type="server_error",
        retry_after=1,
    )
