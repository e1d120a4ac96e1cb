"""OpenAI's Responses API under ``/v1/responses`` (docs/responses.md): created on the chat
path, stored per tenant."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from app.api.completion_response import CompletionResponse, EventStreamResponse
from app.api.deps import CurrentPrincipal, GatewayDep, RequestId
from app.api.errors import PRECHECKED
from app.api.generation_route import GenerationRoute
from app.api.openai import ERROR_RESPONSES, GENERATION_RESPONSES
from app.errors import BadRequestError, NotFoundError
from app.protocol.responses_api import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from app.serving.lifecycle.runs import ADAPTER_VERSION_HEADER
from app.serving.preparation.responses import translate
from app.serving.responses.chain import continued
from app.serving.responses.replay import replayed
from app.serving.responses.service import ResponsesService
from app.store.responses import StoredResponse, page

router = APIRouter(prefix="/v1", tags=["openai"])

ROOM_MAX_AGE = 1.0
"""Seconds a stored response's storage check may rest on this replica's last reading of the
tenant's room, with no wait on the store (a refusal is read fresh): the cap may be passed by
what the tenant stores in that second, as it may be by a response's own size."""


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.")


async def create_response(
    body: ResponsesRequest,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    request_id: RequestId,
    http: Request,
) -> Response:
    if body.store:
        # A stored response counts against the tenant's storage cap, with its files.
        await gateway.files.check_room(principal.tenant, 0, max_age=ROOM_MAX_AGE)
    # Translated to the chat request it runs as; the rest is the chat path's (CompletionResponse).
    chain = await continued(gateway.responses, principal.tenant.uid, body)
    translated = translate(body, chain.context, response_id=f"resp_{request_id}")
    service = ResponsesService(gateway.backend.chat, translated, gateway.responses)
    if body.background:
        queued = await gateway.background_responses.start(
            service,
            translated,
            principal,
            request_id,
            chain.pinned,
            prechecked=PRECHECKED in http.scope.get("state", {}),
        )
        version = (
            {} if queued.adapter is None else {ADAPTER_VERSION_HEADER: str(queued.adapter.version)}
        )
        return JSONResponse(queued.body, headers=version)
    return CompletionResponse(
        gateway.tracker, service, translated.chat, principal, request_id, pinned=chain.pinned
    )


# On the hot path with chat: served by GenerationRoute (app/api/generation_route.py).
router.add_api_route(
    "/responses",
    create_response,
    methods=["POST"],
    response_model=ResponseObject,
    responses=GENERATION_RESPONSES,
    route_class_override=GenerationRoute,
)


async def _stored(
    gateway: GatewayDep, principal: CurrentPrincipal, response_id: str
) -> StoredResponse:
    stored = await gateway.responses.get(principal.tenant.uid, response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


@router.get("/responses/{response_id}", response_model=ResponseObject, responses=ERROR_RESPONSES)
async def retrieve_response(
    response_id: str,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """The stored Response; with ``stream``, a background response's events after
    ``starting_after``, derived from its row (:mod:`app.serving.responses.replay`)."""
    stored = await _stored(gateway, principal, response_id)
    if not stream:
        if starting_after is not None:
            raise BadRequestError(
                "starting_after is read with stream=true.", param="starting_after"
            )
        return JSONResponse(stored.body)
    if not stored.body.get("background"):
        raise BadRequestError(
            "Only a background response's events can be streamed again.", param="stream"
        )
    events = replayed(gateway.responses, principal.tenant.uid, response_id, starting_after)
    return EventStreamResponse(events)


@router.post(
    "/responses/{response_id}/cancel", response_model=ResponseObject, responses=ERROR_RESPONSES
)
async def cancel_response(
    response_id: str, gateway: GatewayDep, principal: CurrentPrincipal
) -> Response:
    """Cancel a background response: aborted on the engine and settled with what it produced;
    one that has ended is returned unchanged."""
    stored = await _stored(gateway, principal, response_id)
    if not stored.body.get("background"):
        raise BadRequestError("Cannot cancel a synchronous response.")
    return JSONResponse(await gateway.background_responses.cancel(stored))


@router.delete(
    "/responses/{response_id}", response_model=DeletedResponse, responses=ERROR_RESPONSES
)
async def delete_response(
    response_id: str, gateway: GatewayDep, principal: CurrentPrincipal
) -> DeletedResponse:
    if not await gateway.responses.delete(principal.tenant.uid, response_id):
        raise _not_found(response_id)
    return DeletedResponse(id=response_id)


@router.get(
    "/responses/{response_id}/input_items",
    response_model=InputItemList,
    responses=ERROR_RESPONSES,
)
async def list_input_items(
    response_id: str,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> InputItemList:
    stored = await _stored(gateway, principal, response_id)
    found = page(stored.input_items, after=after, limit=limit, order=order)
    if found is None:
        raise BadRequestError(f"No input item with id '{after}' in this response.", param="after")
    return InputItemList(data=found.items, has_more=found.has_more)
