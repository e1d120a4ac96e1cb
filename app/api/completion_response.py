"""The response that runs a completion request's lifecycle (:class:`CompletionResponse`: the
route returns it, and the request is tracked, run and settled while it is sent), and the SSE
response that stops its work when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Generic

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app import tracing
from app.access_log import STATE as ACCESS_STATE
from app.api.errors import PRECHECKED, render
from app.api.streaming_app import SERVER_SEND, body_writer
from app.errors import GatewayError
from app.overhead import STATE as OVERHEAD_STATE
from app.overhead import RequestOverhead
from app.protocol import SamplingFields
from app.serving.lifecycle.runs import ClientDisconnected, Request, Service
from app.serving.lifecycle.tracking import RequestTracker
from app.tenancy.grants import Pin
from app.tenancy.tenants import Principal


class CompletionResponse(Response, Generic[Request]):
    """The answer to a completion request, JSON or SSE, produced inside
    :meth:`RequestTracker.track`: the request is admitted before the first byte is sent and
    settled once after the last, whichever way it ends. A refusal (404, 429, 400...) is
    rendered here, since the route has already returned this response."""

    def __init__(
        self,
        tracker: RequestTracker,
        service: Service[Request, Any],
        request: Request,
        principal: Principal,
        request_id: str,
        pinned: Pin | None = None,
    ) -> None:
        # Not Response's own state (a body and its headers): whatever is sent, __call__
        # makes it.
        self._pinned = pinned
        self._tracker = tracker
        self._service = service
        self._request = request
        self._principal = principal
        self._request_id = request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service, request = self._service, self._request
        streamed: EventStreamResponse | None = None
        state = scope.get("state", {})
        overhead: RequestOverhead | None = state.get(OVERHEAD_STATE)
        if overhead is not None:
            overhead.end("authentication")
        request_trace = tracing.of(overhead)
        if request_trace is not None:
            principal = self._principal
            request_trace.identified(
                principal.tenant.id,
                principal.key_id,
                request.model,
                _completion_limit(request),
                request.stream,
            )
        # One watch for the whole request: the wait for a slot, the stream or the answer.
        watch = DisconnectWatch(receive)
        try:
            tracked = self._tracker.track(
                service,
                request,
                self._principal,
                self._request_id,
                body_bytes=_body_bytes(scope),
                prechecked=PRECHECKED in state,
                pinned=self._pinned,
                overhead=overhead,
                access=state.get(ACCESS_STATE),
            )
            async with tracked as run:
                if request.stream:
                    events = service.stream(request, run)
                    first = None
                    if service.fails_before_streaming:
                        first = await _first(events)
                    headers = _with_overhead(run.headers, overhead)
                    streamed = EventStreamResponse(
                        events, headers=headers, first=first, watch=watch
                    )
                    await streamed(scope, receive, send)
                    return
                try:
                    result = await service.complete(request, run)
                finally:
                    watch.stop()
                headers = _with_overhead(run.headers, overhead)
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            watch.forgive()
            return
        except ClientDisconnected:
            return
        except GatewayError as exc:
            watch.stop()
            if request_trace is not None:
                request_trace.failed(exc)
            if streamed is not None and streamed.started:
                raise
            await render(exc)(scope, receive, send)
            return
        finally:
            watch.stop()
        await JSONResponse(result.model_dump(mode="json"), headers=headers)(scope, receive, send)


class DisconnectWatch:
    """Cancels the task that creates it as soon as the client disconnects, until
    :meth:`stop`: a request waiting for a slot, for the engine or for the upstream stops its
    work then, not at its next write. One task per request watches ``receive``; the work
    itself runs in the request's own task (a task per piece of work cost more than the work).

    The task is cancelled once, and :attr:`disconnected` set; whoever catches that
    cancellation calls :meth:`forgive` and goes on (settles, returns). Stop it before the
    response's end is sent: the server then answers ``receive`` with a disconnect too."""

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.disconnected = False
        self._watcher: asyncio.Task[None] | None = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                self._watcher = None
                self._task.cancel()
                return

    def stop(self) -> None:
        """Stop watching (the task is not cancelled from now on)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def forgive(self) -> None:
        """The cancellation the disconnect caused has been caught: the task is not being
        cancelled any more."""
        self._task.uncancel()


EVENT_STREAM_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


class EventStreamResponse(StreamingResponse):
    """An SSE response whose body iterator is cancelled as soon as the client
    disconnects, not at the next write, and always closed before this returns. A client that
    leaves ends it (it returns), as one that reads it to its end does.

    It has no ``send`` wrapper of its own, and sends its events to the server's ``send``
    where :class:`StreamingApp` has kept it in the scope: each layer of the ``send`` chain
    would cost once per streamed token.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[str],
        *,
        headers: Mapping[str, str] | None = None,
        first: str | None = None,
        watch: DisconnectWatch | None = None,
    ) -> None:
        """``first``: an event already read from ``content``, sent before the rest;
        ``watch``: the request's, where it has one (else the response watches on its own)."""
        # As StreamingResponse's own, which also looks for a body, a length and a charset
        # none of which an event stream has.
        self.status_code = 200
        self.background = None
        self.body_iterator = content
        self.raw_headers = [
            *(
                (name.lower().encode("latin-1"), value.encode("latin-1"))
                for name, value in (headers or {}).items()
            ),
            EVENT_STREAM_TYPE,
        ]
        self._events = content
        self._first = first
        self._watch = watch
        self.started = False
        """Whether the response's start has been sent: from then on, a failure can only be
        reported in the stream."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self._watch or DisconnectWatch(receive)
        stream = asyncio.ensure_future(self._stream(send, scope.get(SERVER_SEND, send), watch))
        try:
            # In a task of its own: each token wakes the task that waits for it, and every
            # coroutine that task is awaited through, server and middleware included, resumes
            # for it. The request's task, cancelled by the watch, cancels this one.
            await stream
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            watch.forgive()
        except ClientDisconnected:
            pass
        finally:
            watch.stop()
            # Cancelled mid-write, the generator is only suspended: close it now, not
            # whenever the garbage collector finds it.
            await self._events.aclose()  # type: ignore[attr-defined]

    async def _stream(self, send: Send, send_body: Send, watch: DisconnectWatch) -> None:
        if watch.disconnected:
            raise ClientDisconnected
        self.started = True
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        write = body_writer(send_body)
        if self._first is not None:
            await write(self._first.encode())
        async for event in self._events:
            # The watch cancels this task only at a suspension point: a generator whose next
            # output is always ready, writing to a closed connection (which returns at once),
            # would never reach one.
            if watch.disconnected:
                raise ClientDisconnected
            await write(event.encode())
        # The server answers ``receive`` with a disconnect once the response has ended.
        watch.stop()
        await send_body({"type": "http.response.body", "body": b"", "more_body": False})


def _with_overhead(headers: dict[str, str], overhead: RequestOverhead | None) -> dict[str, str]:
    """``headers``, with ``x-gateway-overhead-ms`` where the deployment asks for it."""
    if overhead is not None and overhead.header_wanted:
        name, value = overhead.header()
        headers[name] = value
    return headers


def _completion_limit(request: SamplingFields) -> int | None:
    """The completion tokens ``request`` asks for at most (chat's ``max_completion_tokens``
    first), as the client sent it."""
    limit: int | None = getattr(request, "completion_limit", request.max_tokens)
    return limit


def _body_bytes(scope: Scope) -> int | None:
    """The request body's size, where it is one declared ``Content-Length`` (not chunked)."""
    declared = [value for name, value in scope["headers"] if name == b"content-length"]
    chunked = any(name == b"transfer-encoding" for name, _ in scope["headers"])
    if len(declared) != 1 or not declared[0].isdigit() or chunked:
        return None
    return int(declared[0])


async def _first(events: AsyncIterator[str]) -> str:
    """The first event of ``events``, once it is ready. The response starts only then, so
    that a stream that fails before producing anything (in the front role: an upstream that
    refuses the request, or does not answer) is answered with its error's own status, not
    with a 200 that carries an error event. The rest is read from ``events`` itself: a
    generator around it would cost each token one more step."""
    try:
        return await anext(events)
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise
