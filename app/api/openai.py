"""The OpenAI-compatible surface under ``/v1``."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app import metrics
from app.api.deps import CurrentPrincipal, GatewayDep, RequestId
from app.api.streaming import EventStreamResponse, cancel_on_disconnect
from app.errors import GatewayError
from app.gateway import Gateway
from app.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from app.serving.chat import ChatService
from app.serving.completions import CompletionService
from app.tenancy.models import Principal

router = APIRouter(prefix="/v1", tags=["openai"])

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Invalid request (OpenAI error shape)"},
    401: {"description": "Missing or invalid API key"},
    404: {"description": "Unknown model, or one the caller may not use"},
    429: {"description": "Rate limit (Retry-After) or budget (insufficient_quota) reached"},
    503: {"description": "Engine not ready"},
}


async def serve(
    service: ChatService | CompletionService,
    body: Any,
    request: Request,
    gateway: Gateway,
    principal: Principal,
    request_id: str,
) -> Response:
    """Resolve, admit (quota), run; the reservation is settled however it ends."""
    try:
        target = gateway.registry.resolve(principal.tenant, body.model)
        generation = await gateway.tracker.admit(
            service.prepare(body, principal, target, request_id)
        )
    except GatewayError as exc:
        # Requests the engine never saw; the tracker counts the others.
        granted = body.model in principal.tenant.adapters or (
            body.model == gateway.registry.base_model_id and principal.tenant.allow_base_model
        )
        model = body.model if granted else metrics.UNKNOWN_MODEL
        status = exc.code or exc.error_type
        metrics.REQUESTS.labels(principal.tenant.id, model, service.endpoint, status).inc()
        raise
    # Settles only a request that never reached the engine (its run settles it).
    unstarted = partial(gateway.tracker.settle, generation, 0)
    if body.stream:
        return EventStreamResponse(
            service.stream(body, generation), headers=generation.headers, on_close=unstarted
        )
    try:
        result = await cancel_on_disconnect(request, service.complete(body, generation))
    finally:
        unstarted()
    return JSONResponse(result.model_dump(mode="json"), headers=generation.headers)


@router.post("/chat/completions", response_model=ChatCompletion, responses=ERROR_RESPONSES)
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    request_id: RequestId,
) -> Response:
    return await serve(gateway.chat, body, request, gateway, principal, request_id)


@router.post("/completions", response_model=Completion, responses=ERROR_RESPONSES)
async def create_completion(
    body: CompletionRequest,
    request: Request,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    request_id: RequestId,
) -> Response:
    return await serve(gateway.completions, body, request, gateway, principal, request_id)


def _card(entry_id: str, parent: str | None, owner: str) -> ModelCard:
    return ModelCard(id=entry_id, owned_by=owner, parent=parent, root=parent or entry_id)


@router.get("/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(gateway: GatewayDep, principal: CurrentPrincipal) -> ModelList:
    owner = principal.tenant.id
    return ModelList(
        data=[_card(e.id, e.parent, owner) for e in gateway.registry.models_for(principal.tenant)]
    )


@router.get("/models/{model:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def retrieve_model(model: str, gateway: GatewayDep, principal: CurrentPrincipal) -> Any:
    target = gateway.registry.resolve(principal.tenant, model)
    parent = gateway.registry.base_model_id if target.adapter is not None else None
    return JSONResponse(_card(model, parent, principal.tenant.id).model_dump())
