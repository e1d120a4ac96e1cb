"""A chat request checked and tokenised, wherever it then runs: the chat template with tools
rendered, the parser that will read ``auto``'s calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.errors import BadRequestError, GatewayError
from app.protocol import ChatCompletionRequest
from app.serving.preparation import generation as gen
from app.serving.preparation import tools
from app.serving.preparation.structured import OutputConstraints
from app.tenancy.tenants import ModelTarget, Principal

if TYPE_CHECKING:
    # Annotations only: vLLM's tool parsers load where one is set (preparation.tools).
    from vllm.tool_parsers import ToolParser


class ChatPreparation(gen.Preparation[ChatCompletionRequest]):
    """A chat request checked and tokenised, wherever it then runs."""

    endpoint = "chat.completions"

    def __init__(
        self,
        model: gen.PromptModel,
        constraints: OutputConstraints | None = None,
        tool_parser: type[ToolParser] | None = None,
    ) -> None:
        super().__init__(model, constraints)
        self.tool_parser = tool_parser

    def auto_calls(self, request: ChatCompletionRequest) -> tools.AutoCalls | None:
        """The parser that reads ``auto``'s calls; refused (before anything is held) when
        no parser is configured."""
        if not request.auto_tools:
            return None
        if self.tool_parser is None:
            # Telling a call from text in free output needs a parser that fits the
            # model's own tool-call format.
            raise BadRequestError(
                "`tool_choice` `auto` (the default when `tools` are given) needs a tool-call "
                "parser, and this gateway has none configured (LORA_GATEWAY_TOOL_CALL_PARSER): "
                "send `required`, a named function, or `none`",
                param="tool_choice",
            )
        try:
            return tools.AutoCalls(self.tool_parser, self.model.tokenizer, request)
        except (RuntimeError, ValueError, KeyError) as error:
            # A parser that cannot find its markers in this model's vocabulary (llama3_json
            # without <|python_tag|>) is a misconfigured gateway, not a bad request.
            raise GatewayError(
                f"the configured tool-call parser does not fit this model: {error}"
            ) from error

    def prepare(
        self,
        request: ChatCompletionRequest,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> gen.Generation:
        auto = self.auto_calls(request)
        tokenizer = self.model.tokenizer
        text = tools.render_prompt(tokenizer, request)
        self._refuse_if_never_fits(text, "messages")
        prompt = tokenizer.encode(text, add_special_tokens=False)
        generation = self._generation(request, prompt, principal, target, request_id)
        if auto is not None and not auto.skip_special_tokens:
            # The parser's markers (hermes' <tool_call>) are special tokens in some models.
            generation.params.skip_special_tokens = False
        return generation
