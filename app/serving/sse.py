"""Server-sent events as OpenAI streams them."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable

from pydantic import BaseModel
from vllm import CompletionOutput, RequestOutput

from app.errors import GatewayError
from app.protocol import Usage
from app.serving.preparation.generation import usage as token_usage

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def event(payload: BaseModel | str) -> str:
    """One SSE event: a chunk model, or a chunk's JSON text already encoded."""
    body = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {body}\n\n"


async def event_stream(
    outputs: AsyncIterator[RequestOutput],
    *,
    opening: Iterable[BaseModel | str],
    chunk: Callable[[CompletionOutput], BaseModel | str | None],
    usage: Callable[[Usage], BaseModel | str] | None,
    prompt_tokens: int,
) -> AsyncIterator[str]:
    """``opening`` events, one ``chunk`` per delta (none where it gives ``None``: a delta
    held back to be sent later; a ``str`` is the chunk's JSON, already encoded), then (when
    the client asked for it) the ``usage`` chunk, and [DONE].

    The opening events leave with the engine's first output, not before: clients time the
    first token by the first event (vLLM's server opens its streams the same way), and an
    opening sent at admission would report a queued request as already answering.

    The events of one engine output (the opening, one per choice) are yielded as one
    string, and so are the last ones: each yield is a write through every layer of the
    server, which costs more than the event's encoding.

    An error once the response has started can only be reported in-band:
    it becomes one OpenAI-shaped error event before [DONE].
    """
    completion_tokens = 0
    opened = False
    try:
        async for output in outputs:
            deltas = output.outputs
            if opened and len(deltas) == 1:  # most outputs: one choice's next tokens
                completion_tokens += len(deltas[0].token_ids)
                piece = chunk(deltas[0])
                if piece is not None:
                    yield event(piece)
                continue
            events = [] if opened else [event(payload) for payload in opening]
            opened = True
            for delta in deltas:
                completion_tokens += len(delta.token_ids)
                piece = chunk(delta)
                if piece is not None:
                    events.append(event(piece))
            if events:
                yield "".join(events)
    except GatewayError as exc:
        yield f"data: {_error_json(exc)}\n\n{DONE}"
    except Exception:
        logger.exception("stream failed")
        error = GatewayError("The server had an error while streaming.")
        yield f"data: {_error_json(error)}\n\n{DONE}"
    else:
        if usage is None:
            yield DONE
        else:
            yield event(usage(token_usage(prompt_tokens, completion_tokens))) + DONE


def _error_json(exc: GatewayError) -> str:
    return json.dumps(exc.body())
