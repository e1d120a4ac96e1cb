"""The OpenAI-compatible surface under ``/v1``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from app import protocol
from app.api.completion_response import CompletionResponse
from app.api.deps import CurrentPrincipal, GatewayDep, RequestId
from app.api.generation_route import GenerationRoute
from app.errors import BadRequestError
from app.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
)

router = APIRouter(prefix="/v1", tags=["openai"])

_DESCRIPTIONS = {
    400: "Invalid request: `param` names the field",
    401: "Missing or invalid API key",
    404: "Unknown model, or one the caller may not use",
    413: "Request body over the size limit",
    429: "Rate limit (Retry-After) or budget (insufficient_quota) reached",
    503: "Engine not ready",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{code: {"model": ErrorResponse, "description": d} for code, d in _DESCRIPTIONS.items()},
    **protocol.ERROR_RESPONSES,
}
# With "stream": true the 200 is server-sent events: `data: <chunk JSON>` lines, then
# `data: [DONE]`.
GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    200: {
        "description": "The completion (JSON), or its chunks as server-sent events",
        "content": {
            "text/event-stream": {
                # One server-sent event.
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "data": {
                            "type": "string",
                            "description": "a chunk (JSON), an error ({'error': ...}), or [DONE]",
                        }
                    },
                }
            }
        },
    },
}


async def create_chat_completion(
    body: ChatCompletionRequest,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    request_id: RequestId,
) -> Response:
    # Parsed and authenticated; the rest happens while the response is sent, inside
    # RequestTracker.track: resolve the model for the tenant, check its limits, prepare
    # (template, tokenise) in its turn, reserve the worst case, wait for a slot, run on
    # the backend, answer (JSON or SSE), settle what it used (docs/architecture.md).
    refuse_long_chunks(body, gateway.settings.max_stream_interval)
    return CompletionResponse(gateway.tracker, gateway.backend.chat, body, principal, request_id)


async def create_completion(
    body: CompletionRequest,
    gateway: GatewayDep,
    principal: CurrentPrincipal,
    request_id: RequestId,
) -> Response:
    refuse_long_chunks(body, gateway.settings.max_stream_interval)
    return CompletionResponse(
        gateway.tracker, gateway.backend.completions, body, principal, request_id
    )


# The hot path: served by GenerationRoute, without FastAPI's per-request dependency solving.
router.add_api_route(
    "/chat/completions",
    create_chat_completion,
    methods=["POST"],
    response_model=ChatCompletion,
    responses=GENERATION_RESPONSES,
    route_class_override=GenerationRoute,
)
router.add_api_route(
    "/completions",
    create_completion,
    methods=["POST"],
    response_model=Completion,
    responses=GENERATION_RESPONSES,
    route_class_override=GenerationRoute,
)


def refuse_long_chunks(body: ChatCompletionRequest | CompletionRequest, limit: int) -> None:
    """Refuse a ``stream_interval`` over the deployment's ``limit``, before anything is held:
    the tokens a chunk holds back are what a front cannot count when its client leaves."""
    if body.stream_interval is not None and body.stream_interval > limit:
        raise BadRequestError(
            f"`stream_interval` may be at most {limit} tokens; it is {body.stream_interval}.",
            param="stream_interval",
        )


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
