"""Server-sent events as OpenAI streams them."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable

from pydantic import BaseModel
from vllm import CompletionOutput, RequestOutput

from app.errors import GatewayError
from app.protocol import Usage
from app.serving.generation import usage as token_usage

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def event(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


async def event_stream(
    outputs: AsyncIterator[RequestOutput],
    *,
    opening: Iterable[BaseModel],
    chunk: Callable[[CompletionOutput], BaseModel | None],
    usage: Callable[[Usage], BaseModel] | None,
    prompt_tokens: int,
) -> AsyncIterator[str]:
    """``opening`` events, one ``chunk`` per delta (none where it gives ``None``: a delta
    held back to be sent later), then (when the client asked for it) the
    ``usage`` chunk, and [DONE].

    The opening events leave with the engine's first output, not before: clients time the
    first token by the first event (vLLM's server opens its streams the same way), and an
    opening sent at admission would report a queued request as already answering.

    An error once the response has started can only be reported in-band:
    it becomes one OpenAI-shaped error event before [DONE].
    """
    completion_tokens = 0
    opened = False
    try:
        async for output in outputs:
            if not opened:
                opened = True
                for payload in opening:
                    yield event(payload)
            for delta in output.outputs:
                completion_tokens += len(delta.token_ids)
                piece = chunk(delta)
                if piece is not None:
                    yield event(piece)
    except GatewayError as exc:
        yield f"data: {_error_json(exc)}\n\n"
    except Exception:
        logger.exception("stream failed")
        yield f"data: {_error_json(GatewayError('The server had an error while streaming.'))}\n\n"
    else:
        if usage is not None:
            yield event(usage(token_usage(prompt_tokens, completion_tokens)))
    yield DONE


def _error_json(exc: GatewayError) -> str:
    return json.dumps(exc.body())
