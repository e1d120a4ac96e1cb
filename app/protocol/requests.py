"""What clients send: chat and text completion requests.

A request is refused (400 naming the field) rather than served differently from what it
asks: fields of OpenAI's API this server does not honour are listed in
``UNSUPPORTED_FIELDS``, and values the engine would reject are bounded here, where the
error can still name the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from app.protocol.common import (
    INT64_MAX,
    Flag,
    Int64,
    JsonNumber,
    OpenAIModel,
    TokenCount,
)
from app.protocol.tools import NamedToolChoice, Tool, ToolCall

MAX_STOP_SEQUENCES = 4
MAX_USER_LENGTH = 256
# OpenAI's bounds on logit_bias.
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0
# vLLM samples greedily below this temperature (vllm.sampling_params._SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5

# Fields of OpenAI's chat and text completion APIs that this server does not honour yet,
# each with the values besides null that mean "off" (SDKs send such defaults). Any other
# value is refused with a 400 naming the field: a client asking for something must never get
# a 200 that silently ignored it. Supporting a field means deleting it here.
UNSUPPORTED_FIELDS: Mapping[str, tuple[object, ...]] = {
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "reasoning_effort": ("none",),
    "verbosity": ("medium",),
    "service_tier": ("auto", "default"),
    "store": (False,),
    # Only meaningful for completions OpenAI stores, which this server never does.
    "metadata": ({},),
    "best_of": (1,),  # text completions only
    "suffix": ("",),  # text completions only
}
# Tool calling is a chat feature: a text completion refuses these like the fields above.
TOOL_FIELDS: Mapping[str, tuple[object, ...]] = {
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True,),
}
# Parts of messages that only make sense with tool calling or audio output.
_UNSUPPORTED_MESSAGE_FIELDS: Mapping[str, tuple[object, ...]] = {
    "function_call": (),
    "audio": (),
}


def refusal(model: str, errors: list[InitErrorDetails]) -> ValidationError:
    # Raised from a "before" validator, a ValidationError keeps its own locations (nested
    # under the enclosing field's), so the 400 names the offending field.
    return ValidationError.from_exception_data(model, errors)


def unsupported(name: str, value: object, message: str) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("unsupported_parameter", message), loc=(name,), input=value
    )


def _shape_error(message: str) -> PydanticCustomError:
    # A union field's own errors are located at one of its members ("prompt.str"); a check
    # of the shape first keeps the location at the field.
    return PydanticCustomError("invalid_type", message)


MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 4096  # over all the messages
MAX_TOOLS = 128  # OpenAI's own limit


def at_most(items: Any, limit: int, what: str) -> Any:
    """Refuse a list over ``limit`` items before any of them is validated: validating each
    item costs the event loop, and a body of a hundred thousand tiny ones costs seconds."""
    if isinstance(items, list) and len(items) > limit:
        raise PydanticCustomError(
            "too_long",
            "at most {limit} {what} are accepted; got {count}",
            {"limit": limit, "what": what, "count": len(items)},
        )
    return items


def active_fields(data: Mapping[str, Any], fields: Mapping[str, tuple[object, ...]]) -> list[str]:
    if fields.keys().isdisjoint(data.keys()):  # most requests: a set operation, in C
        return []
    return [
        name
        for name, off in fields.items()
        if data.get(name) is not None and not any(data[name] == value for value in off)
    ]


def refuse_fields(
    model: str, data: Mapping[str, Any], fields: Mapping[str, tuple[object, ...]]
) -> None:
    """The 400 naming each of ``fields`` that ``data`` sets to anything but null or an "off"
    value: fields this server does not honour, never silently ignored."""
    errors = [
        unsupported(name, data[name], f"`{name}` is not supported by this server; omit it")
        for name in active_fields(data, fields)
    ]
    if errors:
        raise refusal(model, errors)


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_tool_calling(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        role = data.get("role")
        if role == "function":
            message = "`function` messages (the legacy shape) are not supported: send `tool`"
            raise refusal(cls.__name__, [unsupported("role", role, message)])
        if role == "tool" and not isinstance(data.get("tool_call_id"), str):
            error = InitErrorDetails(
                type=PydanticCustomError(
                    "missing_tool_call_id", "a `tool` message needs a string `tool_call_id`"
                ),
                loc=("tool_call_id",),
                input=data.get("tool_call_id"),
            )
            raise refusal(cls.__name__, [error])
        if data.get("tool_calls") and role != "assistant":
            message = "only `assistant` messages carry `tool_calls`"
            raise refusal(cls.__name__, [unsupported("tool_calls", data["tool_calls"], message)])
        message = (
            "`{}` in messages is not supported: this server has no legacy function calls or audio"
        )
        errors = [
            unsupported(name, data[name], message.format(name))
            for name in active_fields(data, _UNSUPPORTED_MESSAGE_FIELDS)
        ]
        if errors:
            raise refusal(cls.__name__, errors)
        return data

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        if content is None or isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise _shape_error("`content` must be a string or a list of text parts")
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind != "text":
                raise PydanticCustomError(
                    "unsupported_content",
                    "content part {index} is of type '{kind}'; only text parts are supported",
                    {"index": index, "kind": str(kind)},
                )
            if not isinstance(part.get("text"), str):
                message = f"content part {index} needs a string `text`"
                raise _shape_error(message)
        return content

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(OpenAIModel):
    include_usage: Flag = False


class JsonSchemaSpec(OpenAIModel):
    """``response_format.json_schema``. Decoding is always constrained to ``schema``, so
    ``strict`` changes nothing (OpenAI's strict mode is what this server always does)."""

    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    # "schema" would shadow a BaseModel attribute: the alias keeps the wire name.
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: Flag | None = None

    @field_validator("json_schema", mode="before")
    @classmethod
    def _an_object(cls, schema: Any) -> Any:
        if not isinstance(schema, Mapping):
            raise _shape_error("`schema` must be a JSON Schema object")
        return schema


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _schema_with_its_type(cls, data: Any) -> Any:
        wanted = isinstance(data, Mapping) and data.get("type") == "json_schema"
        if wanted and data.get("json_schema") is None:
            message = "type `json_schema` needs a `json_schema` object"
            error = InitErrorDetails(
                type=PydanticCustomError("missing_json_schema", message),
                loc=("json_schema",),
                input=None,
            )
            raise refusal(cls.__name__, [error])
        return data


class StructuredOutputs(OpenAIModel):
    """vLLM's ``structured_outputs`` extension: exactly one constraint. vLLM's other keys
    (``structural_tag``, per-request whitespace options its backends ignore) are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    json_schema: dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None
    json_object: Literal[True] | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        given = [
            value
            for value in (self.json_schema, self.regex, self.choice, self.grammar)
            if value is not None
        ]
        if len(given) + (self.json_object is not None) != 1:
            raise PydanticCustomError(
                "one_constraint",
                "exactly one of `json`, `regex`, `choice`, `grammar`, `json_object` is needed",
            )
        return self


def _logit_bias(bias: Any) -> Any:
    # JSON object keys are strings: OpenAI's token ids arrive as "123".
    if not isinstance(bias, Mapping):
        raise _shape_error("`logit_bias` must be an object mapping token ids to biases")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise PydanticCustomError(
            "too_many_biases",
            "at most {limit} tokens may be biased",
            {"limit": MAX_LOGIT_BIAS_ENTRIES},
        )
    parsed: dict[int, float] = {}
    for key, value in bias.items():
        token = str(key)
        if not token.isascii() or not token.isdigit():
            raise PydanticCustomError(
                "logit_bias_key",
                "keys must be token ids (non-negative integers), not '{key}'",
                {"key": token},
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PydanticCustomError("logit_bias_value", "biases must be numbers")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise PydanticCustomError(
                "logit_bias_range",
                "biases must be between -100 and 100; token {token} has {value}",
                {"token": token, "value": value},
            )
        parsed[int(token)] = float(value)
    return parsed


class SamplingFields(OpenAIModel):
    """Fields shared by chat and text completions; null means the field's default."""

    refused_fields: ClassVar[Mapping[str, tuple[object, ...]]] = UNSUPPORTED_FIELDS

    model: str
    temperature: Annotated[float, Field(ge=0, le=2), JsonNumber] | None = None
    top_p: Annotated[float, Field(gt=0, le=1), JsonNumber] | None = None
    n: Annotated[int, Field(ge=1, le=16), JsonNumber] = 1
    max_tokens: TokenCount | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2), JsonNumber] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2), JsonNumber] | None = None
    stream: Flag = False
    stream_options: StreamOptions | None = None
    # Kept for the usage ledger; it changes nothing in the answer.
    user: Annotated[str, Field(max_length=MAX_USER_LENGTH)] | None = None
    response_format: ResponseFormat | None = None
    logit_bias: Annotated[dict[int, float], BeforeValidator(_logit_bias)] | None = None
    # vLLM's extensions, as its own server takes them (extra_body in the openai client).
    ignore_eos: Flag = False
    min_tokens: Annotated[int, Field(ge=0, le=INT64_MAX), JsonNumber] = 0
    structured_outputs: StructuredOutputs | None = None
    # -1 or 0: every token.
    top_k: Annotated[int, Field(ge=-1, le=INT64_MAX), JsonNumber] | None = None
    min_p: Annotated[float, Field(ge=0, le=1), JsonNumber] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2), JsonNumber] | None = None
    # Tokens a streamed chunk gathers (the first and the last are sent at once); never fewer
    # than the deployment's LORA_GATEWAY_STREAM_INTERVAL.
    stream_interval: TokenCount | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        refuse_fields(cls.__name__, data, cls.refused_fields)
        constrained = data.get("response_format")
        if data.get("structured_outputs") is not None and constrained not in (
            None,
            {"type": "text"},
        ):
            raise refusal(
                cls.__name__,
                [
                    unsupported(
                        "structured_outputs",
                        data["structured_outputs"],
                        "`structured_outputs` and `response_format` each constrain the "
                        "output: send one of them",
                    )
                ],
            )
        # OpenAI's API takes null for "use the default"; dropping nulls lets every field
        # keep one non-null type and default.
        return {key: value for key, value in data.items() if value is not None}

    @field_validator("n")
    @classmethod
    def _n_needs_sampling(cls, n: int, info: ValidationInfo) -> int:
        temperature = info.data.get("temperature")
        if n > 1 and temperature is not None and temperature < GREEDY_TEMPERATURE:
            raise PydanticCustomError(
                "greedy_n",
                "`n` must be 1 when `temperature` is 0: greedy sampling gives one answer",
            )
        return n

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, stop: Any) -> Any:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _shape_error("`stop` must be a string or a list of strings")
        if len(stops) > MAX_STOP_SEQUENCES:
            raise PydanticCustomError(
                "too_many_stops",
                "at most {limit} stop sequences are allowed",
                {"limit": MAX_STOP_SEQUENCES},
            )
        if "" in stops:
            raise PydanticCustomError("empty_stop", "stop sequences must not be empty strings")
        return stop

    @property
    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None
    logprobs: Flag = False
    top_logprobs: Annotated[int, Field(ge=0, le=20), JsonNumber] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Flag = True

    @field_validator("messages", mode="before")
    @classmethod
    def _bounded_messages(cls, messages: Any) -> Any:
        at_most(messages, MAX_MESSAGES, "messages")
        if isinstance(messages, list):
            parts = [
                part
                for message in messages
                if isinstance(message, Mapping) and isinstance(message.get("content"), list)
                for part in message["content"]
            ]
            at_most(parts, MAX_CONTENT_PARTS, "content parts (over all messages)")
        return messages

    @field_validator("tools", mode="before")
    @classmethod
    def _bounded_tools(cls, tools: Any) -> Any:
        return at_most(tools, MAX_TOOLS, "tools")

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self) -> ChatCompletionRequest:
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise refusal(
                type(self).__name__,
                [unsupported("tools", names, "tool names must be unique")],
            )
        choice = self.tool_choice
        if choice == "none" or (choice is None and not names):
            return self
        errors: list[InitErrorDetails] = []
        if not names:
            message = "`tool_choice` other than `none` needs `tools`"
            errors.append(unsupported("tool_choice", choice, message))
        elif isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            message = f"`tool_choice` names `{choice.function.name}`, which is not in `tools`"
            errors.append(unsupported("tool_choice", choice.function.name, message))
        constrained = self.structured_outputs is not None or (
            self.response_format is not None and self.response_format.type != "text"
        )
        # ``auto`` (whether a parser is configured is the chat service's to say) decodes
        # freely: a response format may constrain it as it would plain text.
        if not errors and constrained and self.forced_tool is not None:
            message = (
                "a forced tool call constrains the output, like `response_format` and "
                "`structured_outputs`: send one of them"
            )
            errors.append(unsupported("tool_choice", choice, message))
        if errors:
            raise refusal(type(self).__name__, errors)
        return self

    @property
    def auto_tools(self) -> bool:
        """Whether the model chooses between a call and text (``auto``, explicit or the
        default when ``tools`` are given)."""
        return bool(self.tools) and self.tool_choice in (None, "auto")

    @property
    def forced_tool(self) -> Literal["required"] | str | None:
        """``"required"``, the name of the function a call is forced to, or ``None``."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return "required" if self.tool_choice == "required" else None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise PydanticCustomError(
                "top_logprobs_without_logprobs", "`top_logprobs` requires `logprobs` to be true"
            )
        return top

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    refused_fields: ClassVar[Mapping[str, tuple[object, ...]]] = {
        **UNSUPPORTED_FIELDS,
        **TOOL_FIELDS,
    }
    # The bounds also tell /openapi.json's readers (and the fuzzer) that a prompt is not empty.
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[int], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5), JsonNumber] | None = None
    echo: Flag = False
    max_tokens: TokenCount | None = 16

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and any(isinstance(item, (str, list)) for item in prompt):
            raise _shape_error(
                "`prompt` must be one string or one list of token ids; send one request per prompt"
            )
        token_ids = isinstance(prompt, list) and all(
            isinstance(item, int) and not isinstance(item, bool) for item in prompt
        )
        if not (isinstance(prompt, str) or token_ids):
            raise _shape_error("`prompt` must be a string or a list of token ids (integers)")
        if not prompt:
            raise PydanticCustomError("empty_prompt", "`prompt` must not be empty")
        return prompt

    @property
    def completion_limit(self) -> int | None:
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs
