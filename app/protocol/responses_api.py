"""OpenAI's Responses API: what clients send to ``POST /v1/responses`` and the Response object
they get back (docs/responses.md).

A request is refused (400 naming the field) rather than served differently from what it asks:
the fields this server does not honour are in ``REFUSED_FIELDS``, and the input items, content
parts, tools and text formats it does not serve are refused where they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from app.protocol.common import Flag, JsonNumber, ObjectList, OpenAIModel, TokenCount
from app.protocol.requests import (
    MAX_MESSAGES,
    MAX_TOOLS,
    MAX_USER_LENGTH,
    JsonSchemaSpec,
    at_most,
    refusal,
    refuse_fields,
)
from app.protocol.tools import FunctionName

# Fields of OpenAI's Responses API this server does not honour yet, each with the values besides
# null that mean "off". Any other value is a 400 naming the field.
REFUSED_FIELDS: Mapping[str, tuple[object, ...]] = {
    "reasoning": ({},),
    "conversation": (),
    "prompt": (),
    "include": ([],),
    "truncation": ("disabled",),
    "service_tier": ("auto", "default"),
    "max_tool_calls": (),
    "top_logprobs": (0,),
    "prompt_cache_key": (),
    "prompt_cache_retention": (),
    "safety_identifier": (),
    "prompt_cache_options": (),
    "context_management": ([],),
    "moderation": (),
    "image": (),
    "access_programs": (),
    "background_options": (),
    # No obfuscation padding is added to events: asking for it is refused.
    "stream_options": ({}, {"include_obfuscation": False}),
}
MAX_METADATA_PAIRS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class InputText(OpenAIModel):
    """A text part of an input message: ``input_text``, or ``output_text`` (an assistant's
    earlier output, sent back)."""

    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(OpenAIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        if isinstance(content, list):
            for index, part in enumerate(content):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                if kind not in ("input_text", "output_text"):
                    raise PydanticCustomError(
                        "unsupported_content",
                        "content part {index} is of type '{kind}'; only `input_text` and "
                        "`output_text` parts are supported",
                        {"index": index, "kind": str(kind)},
                    )
        return content

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallInput(OpenAIModel):
    """A call the model made in an earlier turn, sent back."""

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: FunctionName
    arguments: str
    id: str | None = None


class FunctionCallOutputInput(OpenAIModel):
    """What the client's function returned for ``call_id``."""

    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[InputText]
    id: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


InputItem = Annotated[
    InputMessage | FunctionCallInput | FunctionCallOutputInput, Field(discriminator="type")
]
INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output")


class FunctionTool(OpenAIModel):
    """Responses' flat function tool (``name`` beside ``type``, not under ``function``)."""

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Flag | None = None


class NamedFunction(OpenAIModel):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIModel):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its name, schema and
    ``strict`` (flat, as the Responses API sends it). Decoding is always constrained to the
    schema, so ``strict`` changes nothing."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")] | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: Flag | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.json_schema is None):
            missing = "name" if self.name is None else "schema"
            message = f"type `json_schema` needs `{missing}`"
            error = InitErrorDetails(
                type=PydanticCustomError("missing_json_schema", message),
                loc=(missing,),
                input=None,
            )
            raise refusal(type(self).__name__, [error])
        return self

    def response_format(self) -> dict[str, Any]:
        """The chat completions ``response_format`` that asks for the same output."""
        if self.type != "json_schema":
            return {"type": self.type}
        spec = JsonSchemaSpec.model_validate(
            {
                "name": self.name,
                "description": self.description,
                "schema": self.json_schema,
                "strict": self.strict,
            }
        )
        return {"type": "json_schema", "json_schema": spec.model_dump(by_alias=True)}


class TextConfig(OpenAIModel):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class ResponsesRequest(OpenAIModel):
    """``POST /v1/responses``'s body, as this server serves it."""

    model: str
    input: Annotated[str, Field(min_length=1)] | list[InputItem]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0, le=2), JsonNumber] | None = None
    top_p: Annotated[float, Field(gt=0, le=1), JsonNumber] | None = None
    user: Annotated[str, Field(max_length=MAX_USER_LENGTH)] | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: Flag = True
    store: Flag = True
    previous_response_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    metadata: dict[str, str] | None = None
    stream: Flag = False
    background: Flag = False

    @field_validator("background")
    @classmethod
    def _stored_and_polled(cls, background: bool, info: ValidationInfo) -> bool:
        # A background response is read by polling its stored row; its event stream is not
        # kept, so it cannot be streamed (nor resumed) yet.
        if background and info.data.get("store") is False:
            raise PydanticCustomError(
                "background_not_stored", "background responses must be stored: `store` must be true"
            )
        if background and info.data.get("stream"):
            raise PydanticCustomError(
                "background_streamed",
                "background responses cannot be streamed; poll GET /v1/responses/{id}",
            )
        return background

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        refuse_fields(cls.__name__, data, REFUSED_FIELDS)
        # Null means "the default", as in OpenAI's API.
        return {key: value for key, value in data.items() if value is not None}

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, items: Any) -> Any:
        at_most(items, MAX_MESSAGES, "input items")
        if not isinstance(items, list):
            return items
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                continue
            # An item without a type is a message (EasyInputMessage).
            kind = item.get("type", "message")
            if kind not in INPUT_ITEM_TYPES:
                raise PydanticCustomError(
                    "unsupported_item",
                    "input item {index} is of type '{kind}'; only `message`, `function_call` "
                    "and `function_call_output` items are supported",
                    {"index": index, "kind": str(kind)},
                )
            if "type" not in item:
                items[index] = {**item, "type": "message"}
        return items

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, tools: Any) -> Any:
        at_most(tools, MAX_TOOLS, "tools")
        if isinstance(tools, list):
            for index, tool in enumerate(tools):
                kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
                if kind != "function":
                    raise PydanticCustomError(
                        "unsupported_tool",
                        "tool {index} is of type '{kind}'; only `function` tools are supported "
                        "(no built-in tools)",
                        {"index": index, "kind": str(kind)},
                    )
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, choice: Any) -> Any:
        if isinstance(choice, Mapping) and choice.get("type") != "function":
            raise PydanticCustomError(
                "unsupported_tool_choice",
                "`tool_choice` may be `none`, `auto`, `required` or a function by name",
            )
        return choice

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and (
            len(metadata) > MAX_METADATA_PAIRS
            or any(
                len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE
                for k, v in metadata.items()
            )
        ):
            raise PydanticCustomError(
                "metadata_too_large",
                "`metadata` holds at most 16 pairs, keys of at most 64 characters and values "
                "of at most 512",
            )
        return metadata


# -- what is sent back -----------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class FunctionCallOutput(BaseModel):
    """A call the model made (the item ``function_call``)."""

    id: str
    type: Literal["function_call"] = "function_call"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    call_id: str
    name: str
    arguments: str


OutputItem = OutputMessage | FunctionCallOutput


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """OpenAI's Response object."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["completed", "incomplete", "failed", "in_progress", "queued", "cancelled"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    instructions: str | None = None
    output: list[OutputItem]
    parallel_tool_calls: bool
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    tool_choice: Any
    tools: list[dict[str, Any]]
    text: dict[str, Any]
    previous_response_id: str | None = None
    store: bool
    background: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    usage: ResponseUsage | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputItemList(ObjectList[dict[str, Any]]):
    """One page of a stored response's input items."""
