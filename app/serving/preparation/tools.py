"""Tool calling on chat completions: the schema a forced call is decoded under, the prompt
that describes tools and earlier calls, and the calls read back from the output.

A forced call (``tool_choice`` ``required`` or a named function) works with any model: the
engine constrains decoding to JSON, as vLLM's own server does. For a named function the
output is that function's arguments; for ``required`` it is an array of
``{"name", "parameters"}`` objects (vLLM's ``get_json_schema_from_tools``, closed to other
keys), at most one when ``parallel_tool_calls`` is false.

Chat templates that know no tools (the embedded SmolLM2's ignores ``tools`` and fails on an
assistant message whose content is null) get a fallback rendering: the tool definitions as
JSON in the system message, earlier calls as a JSON block in the assistant's turn, and each
result as a user turn "Result of <name> (<id>): ...".

``auto`` decodes freely and reads calls back with one of vLLM's tool-call parsers (the
``tool_call_parser`` setting, named as vLLM's ``--tool-call-parser``): only a parser that fits
the model's own call format can tell a call from text.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.protocol.requests import ChatCompletionRequest, ChatMessage
from app.protocol.responses import FunctionCall, ToolCall
from app.protocol.tools import Tool

if TYPE_CHECKING:
    from vllm.tool_parsers import ToolParser

Message = dict[str, Any]

FALLBACK_PREAMBLE = (
    "You can call these tools. Each is described as a JSON object with its name, "
    "description and JSON Schema parameters:"
)


def _parameters(tool: Tool) -> dict[str, Any]:
    # No parameters still means arguments are a JSON object (as vLLM's server decodes them).
    return tool.function.parameters or {"type": "object", "properties": {}}


def forced_call_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema decoding is constrained to, or ``None`` when no call is forced."""
    forced = request.forced_tool
    tools = request.tools or []
    if forced is None:
        return None
    if forced != "required":
        return next(_parameters(t) for t in tools if t.function.name == forced)
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [tool.function.name]},
                        "parameters": _parameters(tool),
                    },
                    "required": ["name", "parameters"],
                    # vLLM's server leaves a call open to other keys; small models then
                    # fill it with made-up ones until max_tokens: a call is these two.
                    "additionalProperties": False,
                }
                for tool in tools
            ],
        },
    }
    if not request.parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def read_calls(request: ChatCompletionRequest, text: str) -> list[ToolCall] | None:
    """The calls a forced output holds; ``None`` when it is not the complete JSON the
    constraint allows (cut short, or ended by a stop sequence), so it is never passed off
    as a call."""
    forced = request.forced_tool
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if forced != "required":
        if not isinstance(value, dict) or forced is None:
            return None
        # The arguments as generated: what a stream of them reassembles to.
        return [_call(forced, text.strip())]
    if not isinstance(value, list) or not value:
        return None
    calls = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = json.dumps(item.get("parameters", {}), ensure_ascii=False)
        calls.append(_call(item["name"], arguments))
    return calls


def _call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=call_id(), function=FunctionCall(name=name, arguments=arguments))


# --- auto: a parser reads calls out of free text -------------------------------------------


def tool_parser_class(name: str) -> type[ToolParser]:
    """vLLM's parser registered as ``name``; a ``ValueError`` listing the known names
    otherwise (raised when the gateway starts, not on the first request)."""
    # Imported here: vLLM's parsers and its chat protocol (about half a second of CPU) load
    # only in a gateway that names a parser, the one place that reads calls with one.
    from vllm.tool_parsers import ToolParserManager

    known = ToolParserManager.list_registered()
    if name not in known:
        raise ValueError(
            f"unknown tool_call_parser {name!r} (LORA_GATEWAY_TOOL_CALL_PARSER); "
            f"vLLM's parsers are: {', '.join(sorted(known))}"
        )
    return ToolParserManager.get_tool_parser(name)


class AutoCalls:
    """One request's parser: vLLM's parsers read vLLM's own request (its ``tools`` and
    ``tool_choice``, never the messages, which stay out), built here from ours."""

    def __init__(
        self, parser_class: type[ToolParser], tokenizer: Any, request: ChatCompletionRequest
    ) -> None:
        # Loaded already with the parser class (tool_parser_class).
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest as VllmChatRequest,
        )

        self.request = VllmChatRequest.model_validate(
            {
                "model": request.model,
                "messages": [],
                "tools": _tool_dicts(request.tools or []),
                "tool_choice": "auto",
                "parallel_tool_calls": request.parallel_tool_calls,
            }
        )
        offered: list[Any] = list(self.request.tools or [])
        self.parser = parser_class(tokenizer, offered)
        if hasattr(self.parser, "skip_reasoning_parsing"):
            # As vLLM's server does without a reasoning parser: reasoning markup is text.
            self.parser.skip_reasoning_parsing = True
        adjusted = self.parser.adjust_request(self.request)
        assert isinstance(adjusted, VllmChatRequest)  # it adjusts the request it is given
        self.request = adjusted

    @property
    def skip_special_tokens(self) -> bool:
        """False where the parser needs its special tokens (``<tool_call>``) in the text."""
        return bool(self.request.skip_special_tokens)

    def read(self, text: str) -> tuple[str | None, list[ToolCall]] | None:
        """The remaining content and the calls the output holds; ``None`` when it holds none."""
        found = self.parser.extract_tool_calls(text, self.request)
        if not found.tools_called or not found.tool_calls:
            return None
        calls = [_call(c.function.name, c.function.arguments) for c in found.tool_calls]
        return found.content or None, calls


# --- the prompt ---------------------------------------------------------------------------


def _tool_dicts(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [tool.model_dump(exclude_none=True) for tool in tools]


def native_messages(messages: Sequence[ChatMessage]) -> list[Message]:
    """The messages as OpenAI sends them, for templates that render tools themselves."""
    rendered: list[Message] = []
    for m in messages:
        message: Message = {
            "role": "system" if m.role == "developer" else m.role,
            "content": m.text() if m.content is not None or m.role != "assistant" else None,
        }
        if m.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        rendered.append(message)
    return rendered


def fallback_messages(messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> list[Message]:
    """Plain system/user/assistant turns that carry tools, calls and results as text."""
    names: dict[str, str] = {}
    rendered: list[Message] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        text = m.text()
        if m.tool_calls:
            calls = [
                {
                    "id": c.id,
                    "name": c.function.name,
                    "arguments": _loose_json(c.function.arguments),
                }
                for c in m.tool_calls
            ]
            names.update((c.id, c.function.name) for c in m.tool_calls)
            block = "Tool calls:\n" + json.dumps(calls, ensure_ascii=False)
            text = f"{text}\n{block}" if text else block
        if role == "tool":
            assert m.tool_call_id is not None  # the protocol requires it on tool messages
            name = names.get(m.tool_call_id, "a tool")
            role, text = "user", f"Result of {name} ({m.tool_call_id}): {text}"
        rendered.append({"role": role, "content": text})
    if tools:
        described = "\n".join(json.dumps(t, ensure_ascii=False) for t in _tool_dicts(tools))
        preamble = f"{FALLBACK_PREAMBLE}\n{described}"
        if rendered and rendered[0]["role"] == "system":
            rendered[0]["content"] = f"{rendered[0]['content']}\n\n{preamble}"
        else:
            rendered.insert(0, {"role": "system", "content": preamble})
    return rendered


def _loose_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def render_prompt(tokenizer: Any, request: ChatCompletionRequest) -> str:
    """The prompt text: the model's own template where it shows every tool, call and result;
    the fallback rendering otherwise."""
    messages, tools = request.messages, request.tools or []
    if not tools and not any(m.tool_calls or m.role == "tool" for m in messages):
        plain = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in messages
        ]
        return _template(tokenizer, plain)
    expected = [t.function.name for t in tools]
    for m in messages:
        expected.extend(call.function.name for call in m.tool_calls or [])
        if m.role == "tool":
            expected.append(m.text())
    try:
        native = _template(tokenizer, native_messages(messages), tools=_tool_dicts(tools) or None)
    except Exception:  # any template failure means it does not know tools
        native = None
    if native is not None and all(item in native for item in expected):
        return native
    return _template(tokenizer, fallback_messages(messages, tools))


def _template(tokenizer: Any, messages: list[Message], **kwargs: Any) -> str:
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **kwargs
    )
    return str(text)
