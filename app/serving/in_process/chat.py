"""Chat on the engine in this process: its deltas merged into an assistant message, or
streamed as chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from functools import partial

from vllm import CompletionOutput

from app.engine.base import Engine
from app.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    Usage,
)
from app.protocol.responses import FinishReason, FunctionCallDelta, ToolCallDelta
from app.quota import Reservation
from app.serving.chunk_encoding import StreamChunks, chat_choice, chat_opening_choice
from app.serving.in_process.engine_run import EngineRun
from app.serving.in_process.logprobs import chat_logprobs
from app.serving.preparation import generation as gen
from app.serving.preparation import tools
from app.serving.preparation.chat import ChatPreparation
from app.serving.sse import event_stream
from app.serving.text_stream import TextEnd, TextPiece, TextStream


class ChatService(gen.Prepared[ChatCompletionRequest]):
    """Chat on the engine in this process."""

    # A stream's opening chunk leaves with the engine's first output; every failure after
    # admission is an error event.
    fails_before_streaming = False

    def __init__(self, preparation: ChatPreparation, engine: Engine) -> None:
        super().__init__(preparation)
        self.preparation: ChatPreparation = preparation
        self.engine = engine

    def start(
        self,
        request: ChatCompletionRequest,
        generation: gen.Generation,
        reservation: Reservation | None,
    ) -> EngineRun:
        return EngineRun(self.engine, generation, reservation)

    async def complete(self, request: ChatCompletionRequest, run: EngineRun) -> ChatCompletion:
        generation = run.generation
        outputs = await gen.collect(run.outputs(), generation.params.n)
        auto = self.preparation.auto_calls(request)
        choices = [
            ChatChoice(
                index=out.index,
                message=message,
                logprobs=self._logprobs(request, out),
                finish_reason=finish,
            )
            for out in outputs
            for message, finish in [_message(request, out, auto)]
        ]
        completion_tokens = sum(len(out.token_ids) for out in outputs)
        return ChatCompletion(
            id=_completion_id(generation),
            model=request.model,
            choices=choices,
            usage=gen.usage(generation.prompt_tokens, completion_tokens),
        )

    def stream(self, request: ChatCompletionRequest, run: EngineRun) -> AsyncIterator[str]:
        generation = run.generation
        # One creation time for the whole stream, as OpenAI and vLLM send it.
        created = int(time.time())

        def chunk(
            choices: list[ChatChunkChoice], usage: Usage | None = None
        ) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=_completion_id(generation),
                created=created,
                model=request.model,
                choices=choices,
                usage=usage,
            )

        if request.forced_tool is not None or request.auto_tools:
            return self._stream_call(request, run, chunk)

        chunks = StreamChunks(chunk([]), chat_choice, request.n)

        num_logprobs = request.num_logprobs

        def delta(out: CompletionOutput) -> str:
            reason = out.finish_reason
            if reason is None and num_logprobs is None:  # most chunks: text alone
                return chunks(out.index, out.text, None, None)
            logprobs = self._logprobs(request, out)
            return chunks(out.index, out.text, logprobs, gen.finish_reason(reason))

        return event_stream(
            run.outputs(),
            opening=[chunks.wrap(chat_opening_choice(i)) for i in range(request.n)],
            chunk=delta,
            usage=chunks.usage if request.include_usage else None,
            prompt_tokens=generation.prompt_tokens,
        )

    async def text_stream(self, request: ChatCompletionRequest, run: EngineRun) -> TextStream:
        """The one choice's text as the engine produces it (:mod:`app.serving.text_stream`)."""
        completion_tokens = 0
        async for output in run.outputs():
            for out in output.outputs:
                completion_tokens += len(out.token_ids)
                yield TextPiece(out.text, gen.finish_reason(out.finish_reason))
        yield TextEnd(run.generation.prompt_tokens, completion_tokens)

    def _stream_call(
        self,
        request: ChatCompletionRequest,
        run: EngineRun,
        chunk: Callable[..., ChatCompletionChunk],
    ) -> AsyncIterator[str]:
        """A call, streamed as OpenAI streams one: a named function's arguments as they are
        generated; for ``required`` and ``auto``, each choice's output is held until it ends
        and then sent as whole calls (or, when it holds no complete call, as content)."""
        named = request.forced_tool not in (None, "required")
        auto = self.preparation.auto_calls(request)
        held: dict[int, list[str]] = {}

        def opening(index: int) -> ChatDelta:
            if not named:
                return ChatDelta(role="assistant")
            call = ToolCallDelta(
                index=0,
                id=tools.call_id(),
                type="function",
                function=FunctionCallDelta(name=request.forced_tool, arguments=""),
            )
            return ChatDelta(role="assistant", tool_calls=[call])

        def delta(out: CompletionOutput) -> ChatCompletionChunk | None:
            logprobs = self._logprobs(request, out)
            finish = gen.finish_reason(out.finish_reason)
            if named:
                arguments = FunctionCallDelta(arguments=out.text)
                body = ChatDelta(tool_calls=[ToolCallDelta(index=0, function=arguments)])
            else:
                text = held.setdefault(out.index, [])
                text.append(out.text)
                if finish is None and logprobs is None:
                    return None
                body = ChatDelta()
                if finish is not None:
                    message, finish = _message(request, _with_text(out, "".join(text)), auto)
                    body = _as_delta(message)
            return chunk(
                [
                    ChatChunkChoice(
                        index=out.index, delta=body, logprobs=logprobs, finish_reason=finish
                    )
                ]
            )

        return event_stream(
            run.outputs(),
            opening=[chunk([ChatChunkChoice(index=i, delta=opening(i))]) for i in range(request.n)],
            chunk=delta,
            usage=partial(chunk, []) if request.include_usage else None,
            prompt_tokens=run.generation.prompt_tokens,
        )

    @staticmethod
    def _logprobs(request: ChatCompletionRequest, out: CompletionOutput) -> ChatLogprobs | None:
        if request.num_logprobs is None or out.logprobs is None:
            return None
        return chat_logprobs(out.token_ids, out.logprobs, request.num_logprobs)


def _completion_id(generation: gen.Generation) -> str:
    return f"chatcmpl-{generation.request_id}"


def _message(
    request: ChatCompletionRequest, out: CompletionOutput, auto: tools.AutoCalls | None
) -> tuple[AssistantMessage, FinishReason]:
    """The assistant's message and finish reason: a forced call that ended complete is
    ``tool_calls`` (finishing ``tool_calls`` for ``required``, ``stop`` for a named function,
    as OpenAI does), as are the calls the parser finds in a finished ``auto`` output (with
    the text beside them as content); anything else, an output cut short included, is
    content as generated."""
    finish = gen.finish_reason(out.finish_reason)
    if auto is not None and finish == "stop":
        found = auto.read(out.text)
        if found is not None:
            content, parsed = found
            return AssistantMessage(content=content, tool_calls=parsed), "tool_calls"
    if request.forced_tool is not None and finish == "stop":
        calls = tools.read_calls(request, out.text)
        if calls is not None:
            reason: FinishReason = "tool_calls" if request.forced_tool == "required" else "stop"
            return AssistantMessage(content=None, tool_calls=calls), reason
    return AssistantMessage(content=out.text), finish  # type: ignore[return-value]


def _as_delta(message: AssistantMessage) -> ChatDelta:
    if message.tool_calls is None:
        return ChatDelta(content=message.content)
    return ChatDelta(
        content=message.content,
        tool_calls=[
            ToolCallDelta(
                index=i,
                id=call.id,
                type="function",
                function=FunctionCallDelta(
                    name=call.function.name, arguments=call.function.arguments
                ),
            )
            for i, call in enumerate(message.tool_calls)
        ],
    )


def _with_text(out: CompletionOutput, text: str) -> CompletionOutput:
    return CompletionOutput(
        index=out.index,
        text=text,
        token_ids=out.token_ids,
        cumulative_logprob=None,
        logprobs=None,
        finish_reason=out.finish_reason,
    )
