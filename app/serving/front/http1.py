"""A lean HTTP/1.1 client for the front's one upstream: keep-alive connections to one origin,
requests ``POST``ed with a JSON body, answers read whole or as server-sent events.

A front's work per streamed token is forwarding one upstream event, so the reader is what a
token costs: a socket read goes straight into httptools' parser (llhttp, the one uvicorn
serves with), and the events in it are split out at once; a general client's layers per read
(transports, pools, tracing, a parser in Python) cost several times the rest of the token.
What a general client also does and the front does not need (redirects, cookies, proxies,
HTTP/2, compression) is left out.

Every failure is a :class:`TransportError`: :class:`ConnectFailed` (nothing accepted the
connection in time), :class:`ReadTimedOut` (no byte for ``timeout`` seconds), or
:class:`ConnectionLost` (reset, closed early, or not HTTP).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, Mapping
from urllib.parse import urlsplit

import httptools

READ_SIZE = 65536


class TransportError(Exception):
    """The exchange failed below HTTP: no answer, or only part of one."""


class ConnectFailed(TransportError):
    pass


class ReadTimedOut(TransportError):
    pass


class ConnectionLost(TransportError):
    pass


class Http1Client:
    """Requests to the origin of ``url`` (its path prefixes every request's path), each on a
    connection of its own, kept open for the next one when the answer was read to its end."""

    def __init__(
        self, url: str, *, timeout: float, connect_timeout: float, max_idle: int = 64
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._authority = parts.netloc.rpartition("@")[2]
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: list[_Connection] = []

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """Send ``body`` (JSON) to ``path``; the answer once its status and headers are in.
        A kept-alive connection the upstream closes before answering is dropped and the
        request sent again on another (nothing of it was answered); a new one that does so
        is a :class:`ConnectionLost`."""
        head = self._head(path, len(body), headers)
        while True:
            connection, reused = self._take_idle(), True
            if connection is None:
                connection, reused = await self._connect(), False
            try:
                await connection.send(head + body)
                await connection.read_head()
            except ConnectionLost:
                connection.close()
                if reused and not connection.received:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            return Response(self, connection)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _head(self, path: str, length: int, headers: Mapping[str, str]) -> bytes:
        lines = [
            f"POST {self._prefix}{path} HTTP/1.1",
            f"Host: {self._authority}",
            "Content-Type: application/json",
            f"Content-Length: {length}",
            "User-Agent: lora-gateway",
        ]
        for name, value in headers.items():
            if any(c in name or c in value for c in "\r\n"):
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {self._authority}: {exc!r}") from exc
        return _Connection(reader, writer, self.timeout)

    def _release(self, connection: _Connection) -> None:
        if connection.reusable and len(self._idle) < self._max_idle:
            self._idle.append(connection)
        else:
            connection.close()


class Response:
    """An answer whose body is still to be read: :meth:`read` or :meth:`events`, once, then
    :meth:`aclose` (which closes the connection unless the body was read to its end, so the
    upstream stops a request nobody reads)."""

    def __init__(self, client: Http1Client, connection: _Connection) -> None:
        self._client = client
        self._connection: _Connection | None = connection
        self.status = connection.status
        self.headers = connection.headers

    async def read(self) -> bytes:
        """The whole body."""
        connection = self._open()
        while not connection.complete:
            await connection.read_more()
        body = b"".join(connection.take_body())
        await self.aclose()
        return body

    async def events(self) -> AsyncGenerator[bytes]:
        """Each ``data:`` field of the event stream, as sent, until the body ends."""
        connection = self._open()
        pending = b""
        while True:
            pieces = connection.take_body()
            if pieces:
                pending += b"".join(pieces)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.startswith(b"data:"):
                        yield line[5:].strip()
            if connection.complete:
                await self.aclose()
                return
            await connection.read_more()

    async def finish(self, within: float) -> None:
        """Read what is left of the body (a stream's end after its last event) for up to
        ``within`` seconds, so the connection can serve another request; else close it."""
        connection = self._connection
        if connection is None:
            return
        try:
            async with asyncio.timeout(within):
                while not connection.complete:
                    await connection.read_more()
        except (TimeoutError, TransportError):
            pass
        await self.aclose()

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._release(connection)  # kept only if read to its end

    def _open(self) -> _Connection:
        if self._connection is None:
            raise RuntimeError("the answer was already read or closed")
        return self._connection


class _Connection:
    """One connection and the answer being read on it (httptools calls the ``on_*``
    methods as it parses)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        # One timer per connection, re-armed by the reads since it was set: a timeout per
        # read (a context manager and a timer each) cost a front as much as parsing the read.
        self._loop = asyncio.get_running_loop()
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._reading = self._timed_out = False
        self._parser: httptools.HttpResponseParser | None = None
        self._body: list[bytes] = []
        self.headers: dict[str, str] = {}
        self.status = 0
        self.received = False
        self._head_done = False
        self.complete = False
        self._keep_alive = False

    @property
    def usable(self) -> bool:
        return not self._writer.is_closing() and not self._reader.at_eof()

    @property
    def reusable(self) -> bool:
        return self.complete and self._keep_alive and self.usable

    async def send(self, data: bytes) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._body, self.headers, self.status = [], {}, 0
        self.received = self._head_done = self.complete = self._keep_alive = False
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError as exc:
            raise ConnectionLost(f"the upstream closed the connection: {exc!r}") from exc

    async def read_head(self) -> None:
        while not self._head_done:
            await self.read_more()

    async def read_more(self) -> None:
        """Feed the parser one socket read (the client's ``timeout`` seconds at most)."""
        self._deadline = self._loop.time() + self._timeout
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._expire)
        self._reading = True
        try:
            data = await self._reader.read(READ_SIZE)
        except OSError as exc:
            if self._timed_out:
                raise self._read_timed_out() from exc
            raise ConnectionLost(f"the upstream connection failed: {exc!r}") from exc
        finally:
            self._reading = False
        if self._timed_out:
            raise self._read_timed_out()
        if not data:
            raise ConnectionLost("the upstream closed the connection before the answer's end")
        self.received = True
        assert self._parser is not None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise ConnectionLost(f"the upstream's answer is not HTTP: {exc}") from exc

    def _expire(self) -> None:
        if self._loop.time() < self._deadline:  # read since: wait for the latest deadline
            self._timer = self._loop.call_at(self._deadline, self._expire)
            return
        self._timer = None
        if self._reading:
            self._timed_out = True
            self._writer.transport.abort()  # ends the pending read

    def _read_timed_out(self) -> ReadTimedOut:
        return ReadTimedOut(f"no answer from the upstream in {self._timeout:g} s")

    def take_body(self) -> list[bytes]:
        body, self._body = self._body, []
        return body

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._writer.close()

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self.status = self._parser.get_status_code()
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        # Read now: the parser forgets the message's headers once it is complete.
        assert self._parser is not None
        self._keep_alive = self._parser.should_keep_alive()
        self.complete = True
