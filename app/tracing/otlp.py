"""Finished request traces as an OTLP ``ExportTraceServiceRequest``, the protobuf bytes
written directly: the same message the SDK's encoder makes of the same spans (a test checks
it), at a small part of its cost. The request's spans have a fixed shape (names from a short
list, few attributes), so each span is a few joined byte strings, the parts that never change
made once."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from app.tracing.records import INTERNAL, ROW, FinishedTrace, SpanRecord

# Span's fields (opentelemetry/proto/trace/v1/trace.proto): trace_id 1, span_id 2,
# trace_state 3, parent_span_id 4, name 5, kind 6, start 7 and end 8 (fixed64), attributes 9,
# status 15, flags 16 (fixed32).
_IDS: Final = struct.Struct(">BBQBBQ")  # span_id, parent_span_id: 8 bytes each
_ID: Final = struct.Struct(">BBQ")
_TIMES: Final = struct.Struct("<BQBQ")
_DOUBLE: Final = struct.Struct("<Bd")
_FLAGS_TAG: Final = b"\x85\x01"  # field 16, fixed32
_HAS_IS_REMOTE: Final = 0x100  # SpanFlags: whether the parent is remote is known ...
_IS_REMOTE: Final = 0x200  # ... and it is
_UNSET_STATUS: Final = b"\x7a\x00"
_ERROR_CODE: Final = b"\x18\x02"
_VARINTS: Final = [bytes((n,)) for n in range(128)]
_MAX_CACHED: Final = 4096


def _varint(n: int) -> bytes:
    if n < 128:
        return _VARINTS[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _string(value: str) -> bytes:
    return _delimited(b"\x0a", value.encode())


def _int(value: int) -> bytes:
    return b"\x18" + _varint(value & 0xFFFF_FFFF_FFFF_FFFF)


def _sequence(values: Iterable[Any]) -> bytes:
    return _delimited(b"\x2a", b"".join(_delimited(b"\x0a", _any_value(v)) for v in values))


_VALUES: Final[dict[type, Callable[[Any], bytes]]] = {
    str: _string,
    bool: lambda value: b"\x10\x01" if value else b"\x10\x00",
    int: _int,
    float: lambda value: _DOUBLE.pack(0x21, value),
    bytes: lambda value: _delimited(b"\x3a", value),
    tuple: _sequence,
    list: _sequence,
}


def _any_value(value: Any) -> bytes:
    """An ``AnyValue``'s fields: string 1, bool 2, int 3, double 4, array 5, bytes 7."""
    encode = _VALUES.get(type(value))
    if encode is not None:
        return encode(value)
    if isinstance(value, bool):
        return _VALUES[bool](value)
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, float):
        return _VALUES[float](value)
    if isinstance(value, str):
        return _string(value)
    return _sequence(value)


_MAX_KEPT_PER_KEY: Final = 1024
_kept: dict[bytes, dict[str, dict[object, bytes]]] = {}
"""Encoded ``KeyValue`` fields by field tag, key, then value: strings, ints and tuples of
strings as themselves, booleans as :data:`_TRUE` or :data:`_FALSE` (``True == 1`` as a
key)."""
_TRUE: Final = object()
_FALSE: Final = object()


_key_fields: dict[str, bytes] = {}


def _attribute(tag: bytes, key: str, value: AttributeValue) -> bytes:
    """The ``KeyValue`` (key 1, value 2) field ``tag``."""
    key_field = _key_fields.get(key)
    if key_field is None:
        key_field = _string_field(b"\x0a", key)
        if len(_key_fields) < _MAX_CACHED:
            _key_fields[key] = key_field
    encoded = _any_value(value)
    pair = key_field + b"\x12" + _varint(len(encoded)) + encoded
    return tag + _varint(len(pair)) + pair


def attributes(tag: bytes, values: Mapping[str, AttributeValue]) -> bytes:
    """``values`` as the repeated ``KeyValue`` field ``tag``. Most of a request's attributes
    (tenants, keys, models, the short lists names come from, token counts) recur from one
    request to the next: strings, ints, booleans and tuples of strings are kept once encoded,
    up to a bound per key."""
    fields = []
    by_key = _kept.get(tag)
    if by_key is None:
        by_key = _kept[tag] = {}
    for key, value in values.items():
        kind = type(value)
        if kind is str or kind is int:
            kept_as: object = value
        elif kind is bool:
            kept_as = _TRUE if value else _FALSE
        elif isinstance(value, tuple) and all(type(item) is str for item in value):
            kept_as = value
        else:
            fields.append(_attribute(tag, key, value))
            continue
        kept = by_key.get(key)
        if kept is None:
            if len(by_key) >= _MAX_CACHED:
                by_key.clear()
            kept = by_key[key] = {}
        field = kept.get(kept_as)
        if field is None:
            field = _attribute(tag, key, value)
            if len(kept) >= _MAX_KEPT_PER_KEY:
                kept.clear()
            kept[kept_as] = field
        fields.append(field)
    return b"".join(fields)


_names: dict[tuple[str, int, int], bytes] = {}


def _constant_part(name: str, kind: int, flags: int) -> bytes:
    part = _names.get((name, kind, flags))
    if part is None:
        part = (
            _string_field(b"\x2a", name)
            + b"\x30"
            + _VARINTS[kind]
            + _FLAGS_TAG
            + flags.to_bytes(4, "little")
        )
        if len(_names) < _MAX_CACHED:
            _names[(name, kind, flags)] = part
    return part


def _string_field(tag: bytes, value: str) -> bytes:
    return _delimited(tag, value.encode())


def _span(trace: bytes, span: SpanRecord, flags: int) -> bytes:
    parts = [
        trace,
        _constant_part(span.name, span.kind, flags),
        _IDS.pack(0x12, 8, span.span_id, 0x22, 8, span.parent_id)
        if span.parent_id
        else _ID.pack(0x12, 8, span.span_id),
        _TIMES.pack(0x39, span.start, 0x41, span.end),
    ]
    if span.attributes:
        parts.append(attributes(b"\x4a", span.attributes))
    if span.failed:
        message = span.message
        status = _string_field(b"\x12", message) if message else b""
        parts.append(_delimited(b"\x7a", status + _ERROR_CODE))
    else:
        parts.append(_UNSET_STATUS)
    return _delimited(b"\x12", b"".join(parts))


_children: dict[tuple[str, int], tuple[struct.Struct, bytes]] = {}


def _child_layout(name: str, trace_field: int) -> tuple[struct.Struct, bytes]:
    """How a child span ``name`` that carries no attributes is written, in a trace whose
    trace id (and state) field is ``trace_field`` bytes long: its length is fixed, so its
    ``ScopeSpans.spans`` tag and length, name, kind, flags and status are one constant
    ``lead``, then come the trace's field, its ids and its times (one ``struct`` pack)."""
    layout = _children.get((name, trace_field))
    if layout is None:
        constant = _constant_part(name, INTERNAL, _HAS_IS_REMOTE) + _UNSET_STATUS
        length = len(constant) + trace_field + 2 * 10 + 2 * 9  # ids, times: tag and value
        lead = b"\x12" + _varint(length) + constant
        packing = struct.Struct(f"<{len(lead)}s{trace_field}s2s8s2s8sBQBQ")
        layout = (packing, lead)
        if len(_children) < _MAX_CACHED:
            _children[(name, trace_field)] = layout
    return layout


def spans(finished: FinishedTrace) -> bytes:
    """The trace's spans, each as a ``ScopeSpans.spans`` field, its children first and the
    request's last (as :func:`app.tracing.sinks.readable_spans` orders them)."""
    finished.identify()
    trace = b"\x0a\x10" + finished.trace_id.to_bytes(16, "big")
    if finished.trace_state:
        trace += _string_field(b"\x1a", finished.trace_state.to_header())
    parts = []
    rows, failures, size, layouts = finished.children, finished.failures, len(trace), _children
    for at in range(0, len(rows), ROW):
        name, span_id, parent_id, start, end = rows[at : at + ROW]
        if (failures and at in failures) or not parent_id:
            parts.append(_span(trace, finished.child(at), _HAS_IS_REMOTE))
            continue
        packing, lead = layouts.get((name, size)) or _child_layout(name, size)
        parts.append(
            packing.pack(
                lead,
                trace,
                b"\x12\x08",
                span_id.to_bytes(8, "big"),
                b"\x22\x08",
                parent_id.to_bytes(8, "big"),
                0x39,
                start,
                0x41,
                end,
            )
        )
    remote = _HAS_IS_REMOTE | (_IS_REMOTE if finished.remote_parent is not None else 0)
    parts.append(_span(trace, finished.root, remote))
    return b"".join(parts)


def envelope(resource: Resource, scope: str, version: str) -> Callable[[bytes], bytes]:
    """How a batch of :func:`spans` becomes an ``ExportTraceServiceRequest``: under one
    ``ResourceSpans`` (``resource``) and one ``ScopeSpans`` (``scope`` at ``version``)."""
    resource_field = _delimited(b"\x0a", attributes(b"\x0a", resource.attributes))
    schema = _string_field(b"\x1a", resource.schema_url) if resource.schema_url else b""
    scope_field = _delimited(
        b"\x0a", _string_field(b"\x0a", scope) + _string_field(b"\x12", version)
    )

    def request(encoded_spans: bytes) -> bytes:
        scope_spans = _delimited(b"\x12", scope_field + encoded_spans)
        return _delimited(b"\x0a", resource_field + scope_spans + schema)

    return request
