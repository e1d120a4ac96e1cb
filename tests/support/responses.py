"""What the Responses API's tests share: the official client on a served gateway, the SDK's
own strict reading of a Response, and an engine that writes a given text."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from openai.types.responses import Response
from vllm import CompletionOutput, RequestOutput

from tests.support.scripted_engine import ScriptedEngine, ScriptedRequest
from tests.support.serving import Served

OTHER = "tenant-b"


async def other_tenants_key(served: Served) -> str:
    """A key of a second tenant, created on ``served``."""
    await served.admin("POST", "/tenants", {"id": OTHER, "name": "B", "allow_base_model": True})
    return str((await served.admin("POST", f"/tenants/{OTHER}/keys", {"name": "k"}))["key"])


def client(served: Served) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key=served.key, max_retries=0)


def strict(response: Any) -> Response:
    """``response`` (the client's, or JSON) validated field by field against the SDK's model:
    the client itself builds its models without validation."""
    return Response.model_validate(response if isinstance(response, dict) else response.to_dict())


class WritingEngine(ScriptedEngine):
    """Writes ``text`` four characters a step, then finishes with ``stop``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    async def _produce(self, request: ScriptedRequest) -> None:
        pieces = [self.text[i : i + 4] for i in range(0, len(self.text), 4)]
        for step, piece in enumerate(pieces):
            await asyncio.sleep(0)
            last = step == len(pieces) - 1
            request.produced += 1
            request.finished = last
            output = CompletionOutput(
                index=0,
                text=piece,
                token_ids=[ord(piece[0])],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason="stop" if last else None,
            )
            request.put(
                RequestOutput(
                    request.request_id,
                    None,
                    request.prompt_token_ids,
                    None,
                    [output],
                    finished=last,
                )
            )
