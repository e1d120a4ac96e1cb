"""The Responses endpoint as a chat service's wrapper: the tracker runs the translated chat
request on the chat service (in-process or upstream), this reads its answer back as a Response
and stores it. One per request: it carries the request's translation."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, cast

from pydantic import BaseModel

from app.errors import GatewayError
from app.protocol import ChatCompletion, ChatCompletionRequest
from app.quota import Reservation
from app.serving.lifecycle.runs import Run, Service
from app.serving.preparation.generation import Generation
from app.serving.preparation.responses import Translated, as_responses_error
from app.serving.responses.events import Failed, response_events, text_events
from app.serving.responses.output import Body, from_chat
from app.serving.text_stream import TextStreaming, streams_as_text
from app.store.responses import ResponseStore, StoredResponse
from app.tenancy.tenants import ModelTarget, Principal

ENDPOINT = "responses"


class ResponsesService:
    """``POST /v1/responses`` for one translated request, on ``chat``."""

    endpoint = ENDPOINT

    def __init__(
        self,
        chat: Service[ChatCompletionRequest, Any],
        translated: Translated,
        store: ResponseStore,
    ) -> None:
        self._chat = chat
        self._translated = translated
        self._store = store
        self.fails_before_streaming = chat.fails_before_streaming

    def prepare(
        self,
        request: ChatCompletionRequest,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> Generation:
        try:
            generation = self._chat.prepare(request, principal, target, request_id)
        except GatewayError as exc:
            raise as_responses_error(exc) from None
        # The chat service's Generation as the Responses endpoint's, its check's errors
        # naming the Responses fields: built from its fields' values, as
        # dataclasses.replace would, without its look at the class's fields each request.
        values = dict(generation.__dict__)
        values["endpoint"] = ENDPOINT
        check = generation.compile_check
        if check is not None:
            values["compile_check"] = _renamed(check)
        return Generation(**values)

    def start(
        self,
        request: ChatCompletionRequest,
        generation: Generation,
        reservation: Reservation | None,
    ) -> Any:
        return self._chat.start(request, generation, reservation)

    async def complete(self, request: ChatCompletionRequest, run: Run) -> BaseModel:
        completion = await self._chat.complete(request, run)
        assert isinstance(completion, ChatCompletion)
        response = from_chat(self._translated, completion)
        await self._keep(run, response.model_dump(mode="json"))
        return response

    def stream(self, request: ChatCompletionRequest, run: Run) -> AsyncIterator[str]:
        return self._events(request, run)

    async def run_detached(self, request: ChatCompletionRequest, run: Run) -> None:
        """Run a background response's ``request`` to its end and store its Response; a
        failure is raised (:class:`StreamFailed` for one the stream met). Read from the chat
        service's stream (:func:`~app.serving.preparation.responses.translate` streams a
        background response's request), never its whole answer: the counts come as it runs,
        and a cancel charges what was produced (in the front role, a whole answer says its
        counts only at its end, which a cancel never sees)."""
        failures: list[Body] = []
        async with aclosing(self._events(request, run, failures.append)) as events:
            async for _ in events:
                pass
        if failures:
            raise StreamFailed(failures[0])

    def _events(
        self, request: ChatCompletionRequest, run: Run, failed: Failed | None = None
    ) -> AsyncGenerator[str]:
        """The Response's events: from the chat service's text stream where it has one for
        ``request`` (plain text), else read back from its chat stream (tools)."""

        async def finish(body: Body) -> None:
            await self._keep(run, body)

        chat = self._chat
        if _streams_text(type(chat)) and streams_as_text(request):
            pieces = cast(TextStreaming, chat).text_stream(request, run)
            return text_events(self._translated, pieces, finish, failed)
        return response_events(self._translated, chat.stream(request, run), finish, failed)

    async def _keep(self, run: Run, body: Body) -> None:
        """Store the Response ``body`` when its request asked for it (a shadow run's never)."""
        generation = run.generation
        if not self._translated.request.store or generation.shadow:
            return
        adapter = generation.target.adapter
        stored = StoredResponse(
            id=body["id"],
            model=generation.target.model,
            adapter=adapter.name if adapter is not None else None,
            adapter_version=adapter.version if adapter is not None else None,
            body=body,
            input_items=self._translated.input_items,
            context=self._translated.context,
        )
        if self._translated.request.background:
            # Its row was stored when it was queued (app/serving/responses/background.py).
            await self._store.finish(
                stored.id,
                stored.body,
                only_from=("queued", "in_progress"),
                answered_by=(stored.adapter, stored.adapter_version),
            )
            return
        self._store.keep(generation.principal.tenant.uid, stored)


class StreamFailed(GatewayError):
    """A response's stream ended with ``response.failed``: its error, as its body."""

    def __init__(self, body: Body) -> None:
        super().__init__(str((body.get("error") or {}).get("message", "The response failed.")))
        self._body = body

    def body(self) -> dict[str, Any]:
        return self._body


@functools.cache
def _streams_text(kind: type) -> bool:
    """Whether a chat service of class ``kind`` is :class:`TextStreaming`: asked once per
    class, as a protocol's ``isinstance`` check walks its members at every call."""
    return issubclass(kind, TextStreaming)


def _renamed(check: Callable[[], None]) -> Callable[[], None]:
    def renamed() -> None:
        try:
            check()
        except GatewayError as exc:
            raise as_responses_error(exc) from None

    return renamed
