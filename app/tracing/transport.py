"""A transport for the SDK's OTLP/HTTP exporter (its ``_transport`` seam) that posts over one
kept ``http.client`` connection to a plain ``http://`` endpoint: the exporter keeps its own
headers, compression, timeout and retries; this only carries each request, with a small part
of the work a pool of urllib3 or a requests session does per post (and, each post being one
``send`` of headers and body, fewer turns of the interpreter's lock)."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.message import Message
from urllib.parse import urlsplit

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    ConnectionError,
    http.client.HTTPException,
    socket.timeout,
    OSError,
)
"""What a lost or refused connection raises (the exporter tries again once at once)."""


class _Headers(Mapping[str, str]):
    """A response's headers, their names in any case."""

    def __init__(self, message: Message) -> None:
        self._message = message

    def __getitem__(self, name: str) -> str:
        values = self._message.get_all(name)
        if not values:
            raise KeyError(name)
        return ", ".join(values)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(name.lower() for name in self._message))

    def __len__(self) -> int:
        return len({name.lower() for name in self._message})


@dataclass(frozen=True, slots=True)
class PlainHttpResult(BaseHTTPResult):
    body: bytes = b""
    message: Message | None = field(default=None, hash=False, compare=False)

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        return _Headers(self.message if self.message is not None else Message())


class PlainHttpTransport(BaseHTTPTransport):
    """Posts to the one ``http://`` origin of the URLs it is given, over a connection kept
    from one post to the next and opened again after any error. Used from one thread (the
    export's)."""

    def __init__(self) -> None:
        self._connection: http.client.HTTPConnection | None = None
        self._origin: tuple[str, int] | None = None
        self._targets: dict[str, tuple[tuple[str, int], str]] = {}

    def _target(self, url: str) -> tuple[tuple[str, int], str]:
        """``url``'s host and port, and the path (and query) to post to."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = self._split(url)
        return target

    @staticmethod
    def _split(url: str) -> tuple[tuple[str, int], str]:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url}: not a plain http:// URL")
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        return (parts.hostname, parts.port or 80), path

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> BaseHTTPResult:
        try:
            origin, path = self._target(url)
            connection = self._connection
            if connection is None or origin != self._origin:
                self.close()
                connection = self._connection = http.client.HTTPConnection(*origin)
                self._origin = origin
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.request(method, path, data, headers or {})
            response = connection.getresponse()
            body = response.read()
            if response.will_close:
                self.close()
        except Exception as error:  # the exporter decides: retried, or logged as failed
            self.close()
            return PlainHttpResult(error=error)
        return PlainHttpResult(
            status_code=response.status, reason=response.reason, body=body, message=response.msg
        )

    def is_connection_error(self, exception: Exception | None) -> bool:
        return isinstance(exception, CONNECTION_ERRORS)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
