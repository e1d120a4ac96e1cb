"""Tool definitions, choices and earlier calls, as chat requests carry them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from app.protocol.common import Flag, OpenAIModel

# OpenAI's function names (and vLLM's): what a tool call may name.
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")]


class CalledFunction(OpenAIModel):
    name: str
    arguments: str


class ToolCall(OpenAIModel):
    """A call an earlier assistant turn made, as the client sends it back."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class FunctionDefinition(OpenAIModel):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Decoding is constrained to ``parameters`` whenever a call is forced: always strict.
    strict: Flag | None = None


class Tool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDefinition


class ChosenFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"]
    function: ChosenFunction
