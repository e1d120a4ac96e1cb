"""Where a Responses request continues a chain (``previous_response_id``): the chain's items,
read from the previous response's row alone, and the adapter version it stays on."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.errors import BadRequestError, NotFoundError
from app.protocol.responses_api import ResponsesRequest
from app.serving.preparation.responses import Item
from app.store.responses import ResponseStore
from app.tenancy.grants import Pin

PARAM = "previous_response_id"


@dataclass(frozen=True)
class Continued:
    context: list[Item] = field(default_factory=list)
    pinned: Pin | None = None


async def continued(store: ResponseStore, tenant_uid: str, request: ResponsesRequest) -> Continued:
    """The chain ``request`` continues: its items, and the version that answered the previous
    response when ``request`` calls the same alias (a split never switches a chain's
    version). Another tenant's response is not found, exactly as an unknown id."""
    previous_id = request.previous_response_id
    if previous_id is None:
        return Continued()
    previous = await store.get(tenant_uid, previous_id)
    if previous is None:
        raise NotFoundError(f"Previous response with id '{previous_id}' not found.", param=PARAM)
    if previous.body.get("status") in ("queued", "in_progress"):
        raise BadRequestError(
            f"Previous response with id '{previous_id}' has not finished yet.", param=PARAM
        )
    pinned = None
    if (
        previous.adapter is not None
        and previous.adapter_version is not None
        and previous.model == request.model
    ):
        pinned = Pin(
            previous.adapter, previous.adapter_version, PARAM,
            "which answered the response this request continues: start a new chain",
        )  # fmt: skip
    return Continued(previous.chain, pinned)
