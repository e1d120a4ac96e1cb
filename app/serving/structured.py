"""Constrained output (``response_format``, vLLM's ``structured_outputs``) as vLLM's
:class:`StructuredOutputsParams`, within the gateway's limits on what a request may ask the
engine to compile.

The engine builds the grammar (xgrammar, falling back to guidance or outlines); a schema that
is not JSON Schema at all, or too large or too deep, is refused here first, with a 400 that
names the field: this runs in the tokenizer thread, so the event loop never walks a schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from vllm.sampling_params import StructuredOutputsParams

from app.errors import BadRequestError
from app.protocol import ChatCompletionRequest, SamplingFields
from app.serving.tools import forced_call_schema
from app.settings import Settings


@dataclass(frozen=True)
class OutputConstraints:
    """The gateway-wide bounds on one request's output constraint."""

    max_bytes: int = 32_768
    max_depth: int = 32

    @classmethod
    def from_settings(cls, settings: Settings) -> OutputConstraints:
        return cls(
            max_bytes=settings.max_structured_output_bytes,
            max_depth=settings.max_json_schema_depth,
        )

    def params(self, request: SamplingFields) -> StructuredOutputsParams | None:
        """The request's constraint for the engine; ``None`` for free text."""
        if isinstance(request, ChatCompletionRequest):
            call = forced_call_schema(request)
            if call is not None:
                self._check_schema(call, "tools")
                return StructuredOutputsParams(json=call)
        response_format = request.response_format
        if response_format is not None and response_format.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if response_format is not None and response_format.json_schema is not None:
            schema = response_format.json_schema.json_schema
            self._check_schema(schema, "response_format.json_schema.schema")
            return StructuredOutputsParams(json=schema)
        wanted = request.structured_outputs
        if wanted is None:
            return None
        if wanted.json_object:
            return StructuredOutputsParams(json_object=True)
        if wanted.json_schema is not None:
            self._check_schema(wanted.json_schema, "structured_outputs.json")
            return StructuredOutputsParams(json=wanted.json_schema)
        if wanted.regex is not None:
            self._check_size(wanted.regex, "structured_outputs.regex")
            return StructuredOutputsParams(regex=wanted.regex)
        if wanted.grammar is not None:
            self._check_size(wanted.grammar, "structured_outputs.grammar")
            return StructuredOutputsParams(grammar=wanted.grammar)
        assert wanted.choice is not None  # the protocol requires exactly one constraint
        self._check_size(json.dumps(wanted.choice), "structured_outputs.choice")
        return StructuredOutputsParams(choice=list(wanted.choice))

    def _check_size(self, text: str, param: str) -> None:
        size = len(text.encode())
        if size > self.max_bytes:
            raise BadRequestError(
                f"`{param}` is {size} bytes; this server compiles at most "
                f"{self.max_bytes} bytes per request.",
                param=param,
            )

    def _check_schema(self, schema: dict[str, Any], param: str) -> None:
        self._check_size(json.dumps(schema, separators=(",", ":")), param)
        depth = _depth(schema)
        if depth > self.max_depth:
            raise BadRequestError(
                f"`{param}` nests objects and arrays {depth} levels deep; this server "
                f"allows at most {self.max_depth}.",
                param=param,
            )
        dialect = schema.get("$schema")
        if dialect is not None and not isinstance(dialect, str):
            raise BadRequestError(
                f"`{param}` is not a valid JSON Schema: `$schema` must be a URI string.",
                param=param,
            )
        try:
            validator_for(schema, default=Draft202012Validator).check_schema(schema)
        except SchemaError as exc:
            where = "/".join(str(part) for part in exc.path)
            at = f" at `{where}`" if where else ""
            raise BadRequestError(
                f"`{param}` is not a valid JSON Schema{at}: {exc.message}", param=param
            ) from exc


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in ``value`` (a scalar is 0), without recursion: the
    size limit bounds the walk, not Python's stack."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in children)
    return deepest
