"""The front role's endpoints: chat and text completions checked, admitted and settled here,
run on the upstream.

A request is prepared exactly as in-process (the same :class:`ChatPreparation` and
:class:`CompletionPreparation`, over the model directory's tokenizer): the same 400s name the
same fields before anything is held, and the reservation is the same worst case. What goes
upstream is built from an allow-list (:func:`upstream_body`): the fields this gateway
supports, as it understood them, never the client's body; so no client can set vLLM's
engine-side fields (``priority``, ``cache_salt``, ``vllm_xargs``, ``kv_transfer_params``...):
the front sets ``cache_salt`` and ``vllm_xargs`` (the tenant's objectives) itself.
What comes back is read into the gateway's own response models, with the tenant's name for the
model: the client sees what an in-process answer would show, and no global name.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel
from vllm.tokenizers import get_tokenizer

from app.errors import BadRequestError, GatewayError
from app.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    SamplingFields,
)
from app.quota import Reservation
from app.scheduling import FcfsAdmission
from app.serving.front.relay import ChunkKind, ChunkRelay, RelayedChunk
from app.serving.front.upstream import Upstream, open_upstream, request_headers
from app.serving.front.upstream_run import ReadT, UpstreamCall, UpstreamRun
from app.serving.preparation.chat import ChatPreparation
from app.serving.preparation.completions import CompletionPreparation
from app.serving.preparation.generation import (
    Generation,
    Preparation,
    Prepared,
    RequestT,
    warm_tokenizer,
)
from app.serving.preparation.structured import OutputConstraints
from app.serving.sse import DONE, event
from app.serving.text_stream import TextEnd, TextPiece, TextStream
from app.settings import Settings
from app.tenancy.adapters import Adapter
from app.tenancy.tenants import ModelTarget, Principal

if TYPE_CHECKING:
    # Annotations only: vLLM's tool parsers load where one is set (preparation.tools).
    from vllm.tool_parsers import ToolParser

logger = logging.getLogger(__name__)


# Sampling as the front decided it (from the prepared SamplingParams), not as the client
# wrote it: the upstream then samples exactly as the in-process engine would, whatever its
# defaults (vLLM applies the model's generation_config to fields left out).
_SAMPLING = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "seed",
)
# Fields passed as the client sent them (the protocol has validated and bounded each).
_SHARED_FIELDS = frozenset({"stop", "logit_bias", "response_format", "structured_outputs"})
CHAT_FIELDS = _SHARED_FIELDS | {
    "messages",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
COMPLETION_FIELDS = _SHARED_FIELDS | {"prompt", "logprobs", "echo"}


@dataclass
class TokenizerModel:
    """The base model's tokenizer and context length, without an engine."""

    tokenizer: Any
    max_model_len: int

    @classmethod
    def load(cls, settings: Settings) -> TokenizerModel:
        """The tokenizer vLLM would load for ``settings.model`` (blocking: file reads)."""
        return cls(get_tokenizer(str(settings.model_dir(weights=False))), settings.max_model_len)


def global_name(target: ModelTarget) -> str:
    """The ``model`` the upstream serves ``target`` under: an adapter version's unique global
    name (``name@vN``, which the engines' LoRA resolver loads from the adapter store), else
    the base model's id."""
    return target.adapter.engine_name if target.adapter is not None else target.model


def upstream_body(
    request: SamplingFields,
    generation: Generation,
    fields: frozenset[str],
    stream_interval: int = 1,
) -> dict[str, Any]:
    """The body forwarded for ``request``: ``fields`` of the parsed request, the sampling the
    front prepared, the global model name, the completion budget the front reserved for, the
    tenant's random prefix-cache salt (a tenant's cached prefixes never serve another, nor
    a later tenant of the same id), the request's objectives (``vllm_xargs``), and for a
    stream at least ``stream_interval`` tokens a chunk (an upstream's own
    ``--stream-interval`` may raise it, never lower it)."""
    body = request.model_dump(mode="json", by_alias=True, exclude_none=True, include=set(fields))
    params = generation.params
    for name in _SAMPLING:
        value = getattr(params, name)
        if value is not None:
            body[name] = value
    limit = "max_completion_tokens" if isinstance(request, ChatCompletionRequest) else "max_tokens"
    body[limit] = params.max_tokens
    body["model"] = global_name(generation.target)
    body["cache_salt"] = generation.principal.tenant.cache_salt
    if params.extra_args:
        # The request's class and latency objectives, for the engine's slot turns: vLLM's
        # server makes them the request's extra_args.
        body["vllm_xargs"] = dict(params.extra_args)
    if request.stream:
        # Counts on every chunk: a stream cut short is charged what it had produced.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        interval = max(stream_interval, params.stream_interval or 1)
        if interval > 1:
            body["stream_interval"] = interval
    return body


class FrontEndpoint(Prepared[RequestT]):
    """One endpoint forwarded upstream; the subclasses name the path, the fields and the
    response models."""

    path: ClassVar[str]
    fields: ClassVar[frozenset[str]]
    answer_model: ClassVar[type[ChatCompletion] | type[Completion]]
    chunk_model: ClassVar[type[ChatCompletionChunk] | type[Completion]]
    chunk_kind: ClassVar[ChunkKind]
    id_prefix: ClassVar[str]
    # An upstream that refuses or cannot be reached is answered with the error's status.
    fails_before_streaming = True

    def __init__(self, preparation: Preparation[RequestT], upstream: Upstream) -> None:
        super().__init__(preparation)
        self._upstream = upstream

    def start(
        self, request: RequestT, generation: Generation, reservation: Reservation | None
    ) -> UpstreamRun:
        name = global_name(generation.target)
        call = UpstreamCall(
            path=self.path,
            body=upstream_body(request, generation, self.fields, self._upstream.stream_interval),
            headers=request_headers(
                generation.principal.tenant, generation.request_id, shadow=generation.shadow
            ),
            names={name: request.model} if name != request.model else {},
        )
        return UpstreamRun(self._upstream, call, generation, reservation)

    async def complete(self, request: RequestT, run: UpstreamRun) -> BaseModel:
        return self._as_ours(await run.answer(self.answer_model), request, run)

    async def stream(self, request: RequestT, run: UpstreamRun) -> AsyncIterator[str]:
        """The upstream's chunks with the gateway's id and the tenant's model name; its usage
        chunk only when the client asked for one. A failure before the first event is raised
        (the response has not started: it gets its own status); after it, it is one error
        event before ``[DONE]``, as in-process."""
        started = False
        relay = ChunkRelay(
            self.chunk_kind,
            f"{self.id_prefix}{run.generation.request_id}",
            request.model,
            request.n,
        )
        try:
            async with aclosing(run.chunks(self.chunk_model, relay)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, RelayedChunk):  # our id and model, no usage
                        started = True
                        yield chunk.event
                        continue
                    if chunk.choices:
                        chunk.usage = None
                    elif not (request.include_usage and chunk.usage is not None):
                        continue
                    started = True
                    yield event(self._as_ours(chunk, request, run))
        except GatewayError as exc:
            if not started:
                raise
            yield f"data: {json.dumps(exc.body())}\n\n"
        yield DONE

    def _as_ours(self, answer: ReadT, request: RequestT, run: UpstreamRun) -> ReadT:
        """``answer`` (read from the upstream, ours to change) with the gateway's id and the
        model's name as the tenant wrote it."""
        answer.id = f"{self.id_prefix}{run.generation.request_id}"
        answer.model = request.model
        return answer


class FrontChatService(FrontEndpoint[ChatCompletionRequest]):
    path = "/v1/chat/completions"
    fields = CHAT_FIELDS
    answer_model = ChatCompletion
    chunk_model = ChatCompletionChunk
    chunk_kind = "chat"
    id_prefix = "chatcmpl-"

    def __init__(self, preparation: ChatPreparation, upstream: Upstream) -> None:
        super().__init__(preparation, upstream)
        self._tool_parser = preparation.tool_parser

    def prepare(
        self,
        request: ChatCompletionRequest,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> Generation:
        if request.forced_tool is not None and self._tool_parser is None:
            # In-process, this gateway decodes a forced call itself; vLLM's server (the
            # engines) refuses one unless started with a tool-call parser.
            raise BadRequestError(
                "`tool_choice` `required` or a named function needs a tool-call parser on "
                "this deployment's engines (LORA_GATEWAY_TOOL_CALL_PARSER, set alike on the "
                "front and the engines): send `none`",
                param="tool_choice",
            )
        return super().prepare(request, principal, target, request_id)

    async def text_stream(self, request: ChatCompletionRequest, run: UpstreamRun) -> TextStream:
        """The one choice's text as the upstream streams it (:mod:`app.serving.text_stream`):
        each chunk read once, into the chunk model, and not written again. (The relay's way,
        ``json.loads`` and its checks in Python, reads a chunk in about twice the time
        pydantic's parser takes: it pays only where it saves writing the chunk again.)"""
        async with aclosing(run.chunks(ChatCompletionChunk)) as chunks:
            async for chunk in chunks:
                assert isinstance(chunk, ChatCompletionChunk)  # no relay: every chunk is read
                if chunk.choices:
                    choice = chunk.choices[0]
                    yield TextPiece(choice.delta.content or "", choice.finish_reason)
        yield TextEnd(run.prompt_tokens, run.completion_tokens)


class FrontCompletionService(FrontEndpoint[CompletionRequest]):
    path = "/v1/completions"
    fields = COMPLETION_FIELDS
    answer_model = Completion
    chunk_model = Completion
    chunk_kind = "completion"
    id_prefix = "cmpl-"


class Front:
    """The front role's backend: requests prepared here with the model's tokenizer, and run
    on the upstream."""

    def __init__(
        self,
        model: TokenizerModel,
        upstream: Upstream,
        constraints: OutputConstraints,
        tool_parser: type[ToolParser] | None,
    ) -> None:
        self.upstream = upstream
        self.chat = FrontChatService(ChatPreparation(model, constraints, tool_parser), upstream)
        self.completions = FrontCompletionService(
            CompletionPreparation(model, constraints), upstream
        )

    async def check_ready(self) -> None:
        """Ready once started. A front does not follow the store or the upstream, which all
        fronts share: were their outage to take every front out of its Service, clients
        would get the ingress's own 503 instead of the front's OpenAI-shaped one (and a
        front serves from its registry while the store is down)."""

    async def check_alive(self) -> None:
        """Nothing of a front dies but its process."""

    async def retire(self, adapter: Adapter) -> None:
        """The engines hold adapters; a front holds nothing of them."""


class FrontFactory:
    name = "the gateway"
    holds_adapter_copies = False
    # The llm-d router's flow control keeps the tenants fair (the front sends the tenant as
    # its fairness id): the front admits first come, first served.
    # The upstream pool drops shadows first (their sheddable objective), not this admission.
    admission = FcfsAdmission(spare=True)

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @asynccontextmanager
    async def open(
        self, constraints: OutputConstraints, tool_parser: type[ToolParser] | None
    ) -> AsyncIterator[Front]:
        """The front's tokenizer and its upstream connection, closed on exit."""
        model = await asyncio.to_thread(TokenizerModel.load, self._settings)
        with constraints.checking(model.tokenizer) as checked:
            await asyncio.to_thread(warm_tokenizer, model.tokenizer, checked)
            async with open_upstream(self._settings) as upstream:
                logger.info("front ready: forwarding to %s", self._settings.upstream_url)
                yield Front(model, upstream, checked, tool_parser)
