"""A batch's lines: read and checked before anything runs, each as the online endpoint checks
its request (the same protocol model, the same resolution of ``model`` and the same
preparation), and later run on the endpoint's service (:mod:`.runner`).

Every malformed line is reported with its number (from 1), as OpenAI's errors name them;
one is enough to fail the batch. Each alias the lines name is resolved once, to the adapter
version every line naming it runs on (a :class:`Pin`), whatever a split or a rollback does
while the batch runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from app.errors import BadRequestError, GatewayError
from app.protocol import ChatCompletionRequest, CompletionRequest
from app.protocol.batches import BatchError
from app.protocol.responses_api import ResponsesRequest
from app.serving.lifecycle.runs import Service
from app.serving.preparation.responses import translate
from app.serving.responses.service import ResponsesService
from app.store.batches import PendingLine
from app.store.responses import ResponseStore
from app.tenancy.grants import Pin
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import ModelTarget, Principal, Tenant

MAX_REPORTED_ERRORS = 1000
KEEP_EVERY = 500
"""Valid lines handed on together, while the rest of the file is checked."""
"""The errors a failed batch lists at most: a file of bad lines names its first ones."""
LINE_FIELDS = ("body", "custom_id", "method", "url")
"""What a line's errors' ``param`` starts with: a field of the line, or of its body."""

RequestModel = type[ChatCompletionRequest] | type[CompletionRequest] | type[ResponsesRequest]
MODELS: dict[str, RequestModel] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
}


@dataclass(frozen=True)
class Services:
    """The online endpoints' services a batch's lines run on (the backend's, once started)."""

    chat: Callable[[], Service[ChatCompletionRequest, Any]]
    completions: Callable[[], Service[CompletionRequest, Any]]
    responses: ResponseStore

    def for_line(self, endpoint: str, body: BaseModel, response_id: str) -> tuple[Any, Any]:
        """The service that runs a line's request, and the request it runs."""
        if isinstance(body, ResponsesRequest):
            translated = translate(body, [], response_id=response_id)
            return ResponsesService(self.chat(), translated, self.responses), translated.chat
        if isinstance(body, CompletionRequest):
            return self.completions(), body
        return self.chat(), body


def parsed_body(endpoint: str, body: dict[str, Any]) -> BaseModel:
    """A line's ``body`` as its endpoint's request; a 400 naming the field otherwise."""
    try:
        request = MODELS[endpoint].model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in ("body", *first.get("loc", ())))
        raise BadRequestError(first["msg"], param=field) from None
    except GatewayError as exc:  # a refused field, named by the model
        named = f"body.{exc.param}" if exc.param else None
        raise BadRequestError(exc.message, param=named) from None
    if getattr(request, "stream", False):
        raise BadRequestError("A batch line cannot be streamed.", param="body.stream")
    if isinstance(request, ResponsesRequest) and request.previous_response_id is not None:
        raise BadRequestError(
            "A batch line cannot continue a stored response.", param="body.previous_response_id"
        )
    if isinstance(request, ResponsesRequest) and request.background:
        raise BadRequestError(
            "A batch line cannot be a background response: a batch runs in the background already.",
            param="body.background",
        )
    return request


def pin_of(target: ModelTarget) -> dict[str, Any] | None:
    adapter = target.adapter
    return None if adapter is None else {"adapter": adapter.name, "version": adapter.version}


def as_pin(pinned: dict[str, Any] | None) -> Pin | None:
    if pinned is None:
        return None
    return Pin(pinned["adapter"], pinned["version"], "model", "which this batch's lines run on")


def pins_of(registry: TenantRegistry, tenant: Tenant) -> dict[str, Any]:
    """Each alias ``tenant`` may call resolved to one adapter version now (of a split, one
    drawn): a batch's lines run on the versions of its creation, whatever a split does while
    it waits and runs."""
    return {alias: pin_of(registry.resolve(tenant, alias)) for alias in tenant.grants}


def _target(
    registry: TenantRegistry, tenant: Tenant, model: str, pins: dict[str, Any]
) -> ModelTarget:
    """``model`` on the version the batch holds it to; drawn now (and held) where it holds
    none, or where a rollback has taken that version from the alias since the batch was
    created: none of its lines has run, so they all still run on one version."""
    pinned = as_pin(pins.get(model))
    if pinned is not None:
        try:
            return registry.resolve(tenant, model, pinned=pinned)
        except BadRequestError:
            pass
    target = registry.resolve(tenant, model)
    pins[model] = pin_of(target)
    return target


@dataclass
class Checked:
    pins: dict[str, Any]
    errors: list[BatchError]
    valid: int = 0
    error_count: int = 0
    cost: int = 0
    """The lines' worst-case tokens, together."""


def _numbered(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        yield from enumerate(handle, start=1)


Prepare = Callable[[Any, Any, Principal, ModelTarget, str], Awaitable[Any]]
"""The online path's preparation of a request (:meth:`RequestTracker.prepare`)."""


async def check_lines(
    path: Path,
    *,
    batch_id: str,
    endpoint: str,
    principal: Principal,
    registry: TenantRegistry,
    services: Services,
    prepare: Prepare,
    keep: Callable[[list[PendingLine]], Awaitable[None]],
    pins: dict[str, Any] | None = None,
) -> Checked:
    """Read and check every line of the file at ``path``, handing the valid ones to ``keep``
    a few hundred at a time while none is invalid: the file is never whole in memory. Each
    model runs on its version in ``pins`` (the batch's creation's, :func:`pins_of`); one
    named there not (granted since), on the version drawn now."""
    checked = Checked(pins=dict(pins or {}), errors=[])
    seen: set[str] = set()
    kept: list[PendingLine] = []
    for number, raw in _numbered(path):
        if not raw.strip():
            continue
        try:
            line, service, request, target = _checked_line(
                raw, number, endpoint, seen, batch_id, principal, registry, services, checked.pins
            )
            # The preparation the online path runs before admitting a request (tokenising,
            # the context's length, the sampling parameters' and constraints' checks):
            # refused here, not mid-batch.
            generation = await prepare(service, request, principal, target, f"{batch_id}-{number}")
            line = replace(line, cost=generation.worst_case_tokens)
            checked.cost += line.cost
        except GatewayError as exc:
            checked.error_count += 1
            if len(checked.errors) < MAX_REPORTED_ERRORS:
                param = exc.param
                if param is not None and not param.startswith(
                    ("body", "custom_id", "method", "url")
                ):
                    param = f"body.{param}"
                checked.errors.append(
                    BatchError(
                        code=exc.code or "invalid_request",
                        message=exc.message,
                        param=param,
                        line=number,
                    )
                )
            continue
        checked.valid += 1
        if not checked.error_count:
            kept.append(line)
            if len(kept) >= KEEP_EVERY:
                await keep(kept)
                kept = []
    if kept and not checked.error_count:
        await keep(kept)
    if not checked.valid and not checked.error_count:
        checked.error_count = 1
        checked.errors.append(
            BatchError(code="empty_file", message="The input file has no requests.")
        )
    return checked


class LineError(BadRequestError):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.code = code


def _checked_line(
    raw: bytes,
    number: int,
    endpoint: str,
    seen: set[str],
    batch_id: str,
    principal: Principal,
    registry: TenantRegistry,
    services: Services,
    pins: dict[str, Any],
) -> tuple[PendingLine, Any, Any, ModelTarget]:
    try:
        line = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise LineError("invalid_json_line", "This line is not parseable as valid JSON.") from None
    if not isinstance(line, dict):
        raise LineError("invalid_json_line", "This line is not a JSON object.")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("missing_required_parameter", "Each line needs a `custom_id`.", "custom_id")
    if custom_id in seen:
        raise LineError(
            "duplicate_custom_id",
            f"The custom_id `{custom_id[:100]}` is used on an earlier line.",
            "custom_id",
        )
    seen.add(custom_id)
    if line.get("method") != "POST":
        raise LineError("invalid_method", "The method of each line must be POST.", "method")
    if line.get("url") != endpoint:
        raise LineError(
            "invalid_url", f"The url of each line must be the batch's endpoint, {endpoint}.", "url"
        )
    body = line.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "Each line needs a `body` object.", "body")
    request = parsed_body(endpoint, body)
    model: str = request.model  # type: ignore[attr-defined]
    target = _target(registry, principal.tenant, model, pins)
    service, prepared = services.for_line(endpoint, request, f"resp_{batch_id}_{number}")
    return PendingLine(line=number, custom_id=custom_id, body=body), service, prepared, target
