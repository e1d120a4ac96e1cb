"""Constrained output (``response_format``, vLLM's ``structured_outputs``) as vLLM's
:class:`StructuredOutputsParams`, within the gateway's limits on what a request may ask the
engine to compile.

The engine builds the grammar (xgrammar, falling back to guidance or outlines); a schema that
is not JSON Schema at all, too large, too deep, or whose counts ask for more than a compile
should cost (:mod:`app.serving.preparation.constraint_counts`) is refused here first, with a
400 that names the field: this runs in the tokenizer thread, so the event loop never walks a
constraint. Regular expressions (``structured_outputs.regex``, a schema's ``pattern`` and
``patternProperties``) are bounded in how deep their groups nest, and whatever checking a
schema raises for a pathological one (Python's ``re`` recurses per group) is a 400 too, never
a 500.

With llguidance, the engine's backend for compact JSON, the constraint is then compiled once
as the engine will compile it, and its first token mask computed, in a process of its own and
within a CPU budget (:mod:`app.serving.preparation.grammar_check`): what llguidance refuses,
or what takes longer, is a 400 naming the field, not an empty 200 from the engine. The
tracker runs that check in the tenant's turn, beside the tokenizer. GBNF grammars reach the
engine already converted to Lark (:mod:`app.serving.preparation.gbnf`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from llguidance.gbnf_to_lark import is_lark_syntax
from vllm.sampling_params import StructuredOutputsParams

from app.errors import BadRequestError
from app.protocol import ChatCompletionRequest, SamplingFields
from app.serving.preparation.constraint_counts import CountLimits, patterns
from app.serving.preparation.gbnf import gbnf_to_lark
from app.serving.preparation.grammar_check import GrammarCheck
from app.serving.preparation.tools import forced_call_schema
from app.settings import Settings


@dataclass(frozen=True)
class Constraint:
    """A request's output constraint for the engine, and the field it came from."""

    params: StructuredOutputsParams
    param: str


@dataclass(frozen=True)
class OutputConstraints:
    """The gateway-wide bounds on one request's output constraint."""

    max_bytes: int = 32_768
    max_depth: int = 32
    # Python's ``re`` (which checks a schema's patterns) recurses per group and gives out
    # near 500; no real pattern nests a tenth of that.
    max_regex_depth: int = 32
    counts: CountLimits = field(default_factory=CountLimits)
    check_cpu_seconds: float = 0.25
    # The engine decodes under llguidance (``structured_outputs_compact``), not xgrammar.
    guidance: bool = True
    # llguidance's compile, checked against the model's tokenizer (:meth:`checking`).
    compiler: GrammarCheck | None = field(default=None, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> OutputConstraints:
        return cls(
            max_bytes=settings.max_structured_output_bytes,
            max_depth=settings.max_json_schema_depth,
            counts=CountLimits(settings.max_schema_array_items, settings.max_constraint_count),
            check_cpu_seconds=settings.constraint_check_cpu_ms / 1000,
            guidance=settings.structured_outputs_compact,
        )

    @contextmanager
    def checking(self, tokenizer: Any) -> Iterator[OutputConstraints]:
        """These bounds, and under llguidance the compile check against ``tokenizer``, whose
        process runs until the block ends."""
        if not self.guidance:
            yield self
            return
        with GrammarCheck(tokenizer, self.check_cpu_seconds) as compiler:
            yield replace(self, compiler=compiler)

    def warm(self) -> None:
        """Have the compile check ready before the first request, which would wait for it."""
        if self.compiler is not None:
            self.compiler.warm()

    def constraint(self, request: SamplingFields) -> Constraint | None:
        """The request's constraint for the engine, within the bounds, and the field it came
        from; ``None`` for free text."""
        checked = self._checked(request)
        if checked is None:
            return None
        params, param = checked
        if self.guidance and params.grammar is not None and not is_lark_syntax(params.grammar):
            params = StructuredOutputsParams(grammar=_as_lark(params.grammar, param))
        return Constraint(params, param)

    def compile_check(self, constraint: Constraint | None) -> Callable[[], None] | None:
        """The check that the engine can enforce ``constraint`` (blocking: the tracker runs
        it in the tenant's turn), or ``None`` where there is nothing to check."""
        if constraint is None or self.compiler is None:
            return None
        return partial(_refuse_if_unenforceable, self.compiler, constraint)

    def _checked(self, request: SamplingFields) -> tuple[StructuredOutputsParams, str] | None:
        """The request's constraint within the bounds, and the field it came from."""
        if isinstance(request, ChatCompletionRequest):
            call = forced_call_schema(request)
            if call is not None:
                self._check_tools(request, call)
                return StructuredOutputsParams(json=call), "tools"
        response_format = request.response_format
        if response_format is not None and response_format.type == "json_object":
            return StructuredOutputsParams(json_object=True), "response_format"
        if response_format is not None and response_format.json_schema is not None:
            param = "response_format.json_schema.schema"
            schema = response_format.json_schema.json_schema
            self._check_schema(schema, param)
            return StructuredOutputsParams(json=schema), param
        wanted = request.structured_outputs
        if wanted is None:
            return None
        if wanted.json_object:
            return StructuredOutputsParams(json_object=True), "structured_outputs.json_object"
        if wanted.json_schema is not None:
            self._check_schema(wanted.json_schema, "structured_outputs.json")
            return StructuredOutputsParams(json=wanted.json_schema), "structured_outputs.json"
        if wanted.regex is not None:
            self._check_size(wanted.regex, "structured_outputs.regex")
            self._check_regex(wanted.regex, "structured_outputs.regex", "it")
            return StructuredOutputsParams(regex=wanted.regex), "structured_outputs.regex"
        if wanted.grammar is not None:
            self._check_size(wanted.grammar, "structured_outputs.grammar")
            self.counts.check_repetitions(wanted.grammar, "structured_outputs.grammar")
            return StructuredOutputsParams(grammar=wanted.grammar), "structured_outputs.grammar"
        assert wanted.choice is not None  # the protocol requires exactly one constraint
        self._check_size(json.dumps(wanted.choice), "structured_outputs.choice")
        return StructuredOutputsParams(choice=list(wanted.choice)), "structured_outputs.choice"

    def _check_size(self, text: str, param: str) -> None:
        size = len(text.encode())
        if size > self.max_bytes:
            raise BadRequestError(
                f"`{param}` is {size} bytes; this server compiles at most "
                f"{self.max_bytes} bytes per request.",
                param=param,
            )

    def _check_tools(self, request: ChatCompletionRequest, call: dict[str, Any]) -> None:
        """Each function a forced call may decode under, named by its place in ``tools``;
        then ``call``, the whole constraint (``required`` joins every function's)."""
        forced = request.forced_tool
        for index, tool in enumerate(request.tools or []):
            parameters = tool.function.parameters
            if parameters is not None and forced in ("required", tool.function.name):
                self._check_schema(parameters, f"tools[{index}].function.parameters")
        self._check_size(json.dumps(call, separators=(",", ":")), "tools")
        self._check_depth(call, "tools")
        self.counts.check_schema(call, "tools")  # the functions' arrays added up

    def _check_depth(self, schema: dict[str, Any], param: str) -> None:
        depth = _depth(schema)
        if depth > self.max_depth:
            raise BadRequestError(
                f"`{param}` nests objects and arrays {depth} levels deep; this server "
                f"allows at most {self.max_depth}.",
                param=param,
            )

    def _check_regex(self, regex: str, param: str, what: str) -> None:
        self.counts.check_repetitions(regex, param, what)
        depth = _group_depth(regex)
        if depth > self.max_regex_depth:
            raise BadRequestError(
                f"`{param}`: {what} nests regular-expression groups {depth} levels deep; "
                f"this server allows at most {self.max_regex_depth}.",
                param=param,
            )

    def _check_schema(self, schema: dict[str, Any], param: str) -> None:
        # Depth first: it is measured without recursion, and bounds what recurses after it.
        self._check_depth(schema, param)
        self._check_size(json.dumps(schema, separators=(",", ":")), param)
        self.counts.check_schema(schema, param)
        for where, pattern in patterns(schema):
            self._check_regex(pattern, param, where)
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
        except RecursionError as exc:
            # The bounds above should leave nothing this deep; a 500 would be worse.
            raise BadRequestError(
                f"`{param}` nests too deeply to be checked.", param=param
            ) from exc
        except (OverflowError, ValueError, re.error) as exc:
            # What a format check raises past jsonschema for a value it cannot even read
            # (``re`` refuses a repeat count over 2**32 with ``OverflowError``).
            raise BadRequestError(
                f"`{param}` is not a valid JSON Schema: {exc}", param=param
            ) from exc


def _as_lark(grammar: str, param: str) -> str:
    try:
        return gbnf_to_lark(grammar)
    except RecursionError as exc:
        raise BadRequestError(f"`{param}` nests too deeply to be read.", param=param) from exc
    except Exception as exc:  # llguidance's parser raises plain Exception for a bad grammar
        raise BadRequestError(f"`{param}` is not a valid grammar: {exc}", param=param) from exc


def _refuse_if_unenforceable(compiler: GrammarCheck, constraint: Constraint) -> None:
    """Compile ``constraint`` as the engine's llguidance backend will and compute its first
    token mask, within the check's budget; what fails is the tenant's 400, with llguidance's
    reason."""
    # Imported here: vLLM's structured-output backends bring its tool and reasoning parsers
    # (about half a second of CPU), which a gateway whose requests ask for no constraint and
    # that names no tool parser never needs.
    from vllm.v1.structured_output.backend_guidance import serialize_guidance_grammar
    from vllm.v1.structured_output.request import get_structured_output_key

    param = constraint.param
    try:
        grammar = serialize_guidance_grammar(
            *get_structured_output_key(constraint.params), disable_any_whitespace=True
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRequestError(f"`{param}` cannot be compiled: {exc}", param=param) from exc
    reason = compiler.refusal(grammar)
    if reason is not None:
        raise BadRequestError(f"`{param}` cannot be enforced: {reason}", param=param)


def wants_constraint(request: SamplingFields) -> bool:
    """Whether ``request`` asks for an output constraint (read without checking it)."""
    response_format = request.response_format
    return (
        request.structured_outputs is not None
        or (response_format is not None and response_format.type != "text")
        or (isinstance(request, ChatCompletionRequest) and request.forced_tool is not None)
    )


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in ``value`` (a scalar is 0), without recursion: the
    request's size bounds the walk, not Python's stack."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in children)
    return deepest


def _group_depth(regex: str) -> int:
    """How deep groups nest in ``regex``, read without compiling it: an escaped parenthesis
    or one in a character class opens nothing (as ``re`` reads them: ``]`` first in a class
    is a literal)."""
    deepest = depth = 0
    escaped = False
    class_from: int | None = None  # where the open character class's members start
    for index, char in enumerate(regex):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif class_from is not None:
            if char == "^" and index == class_from:
                class_from += 1
            elif char == "]" and index > class_from:
                class_from = None
        elif char == "[":
            class_from = index + 1
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(depth - 1, 0)
    return deepest
