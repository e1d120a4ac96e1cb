"""A background response's event stream, derived from its stored row
(``GET /v1/responses/{id}?stream=true&starting_after=N``).

The events are a function of the row alone, so every replica numbers them alike and a client
may resume from any sequence number, on any replica: ``response.created`` (the response
queued), ``response.in_progress``, then, once it has ended, each output item's events as a
live stream has them (its text, or a call's arguments, in one delta) and the final event:
``response.completed``, ``response.incomplete`` or ``response.failed``. A cancelled response's
stream ends after its items, with no final event: OpenAI's events have none for it. The row
of a response still running is read again every :data:`POLL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from app.protocol.responses_api import OutputText
from app.store.responses import ResponseStore

POLL_SECONDS = 0.5
"""How often the row of a response still running is read again while its stream waits."""

ACTIVE = ("queued", "in_progress")
FINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}

Event = dict[str, Any]


def _snapshot(body: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        **body,
        "status": status,
        "output": [],
        "usage": None,
        "error": None,
        "completed_at": None,
        "incomplete_details": None,
    }


def _item_events(index: int, item: dict[str, Any]) -> list[Event]:
    if item.get("type") == "function_call":
        arguments = item.get("arguments", "")
        opened = {**item, "status": "in_progress", "arguments": ""}
        events: list[Event] = [
            {"type": "response.output_item.added", "output_index": index, "item": opened}
        ]
        place = {"item_id": item["id"], "output_index": index}
        if arguments:
            events.append(
                {"type": "response.function_call_arguments.delta", **place, "delta": arguments}
            )
        events.append(
            {"type": "response.function_call_arguments.done", **place, "arguments": arguments}
        )
    else:
        parts = item.get("content") or [OutputText(text="").model_dump()]
        text = parts[0].get("text", "")
        opened = {**item, "status": "in_progress", "content": []}
        place = {"item_id": item["id"], "output_index": index, "content_index": 0}
        events = [
            {"type": "response.output_item.added", "output_index": index, "item": opened},
            {
                "type": "response.content_part.added",
                **place,
                "part": OutputText(text="").model_dump(),
            },
        ]
        if text:
            events.append(
                {"type": "response.output_text.delta", **place, "delta": text, "logprobs": []}
            )
        events += [
            {"type": "response.output_text.done", **place, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **place, "part": parts[0]},
        ]
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def derived_events(body: dict[str, Any]) -> list[Event]:
    """The events of the response whose stored body is ``body``, as far as it has gone, each
    with its ``sequence_number``; the events of a body are a prefix of those of any later
    state of it."""
    status = body["status"]
    events: list[Event] = [
        {"type": "response.created", "response": _snapshot(body, "queued")},
    ]
    if status != "queued":
        events.append({"type": "response.in_progress", "response": _snapshot(body, "in_progress")})
    if status not in ACTIVE:
        for index, item in enumerate(body.get("output") or []):
            events += _item_events(index, item)
        final = FINAL_EVENTS.get(status)
        if final is not None:
            events.append({"type": final, "response": body})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


async def replayed(
    store: ResponseStore, tenant_uid: str, response_id: str, starting_after: int | None
) -> AsyncIterator[str]:
    """The response's events after sequence number ``starting_after`` (all of them for
    None), as server-sent events, until it has ended (or is deleted)."""
    sent = -1 if starting_after is None else starting_after
    while True:
        stored = await store.get(tenant_uid, response_id)
        if stored is None:
            return
        for event in derived_events(stored.body)[sent + 1 :]:
            sent = event["sequence_number"]
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
        if stored.body["status"] not in ACTIVE:
            return
        await asyncio.sleep(POLL_SECONDS)
