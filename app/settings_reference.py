"""The settings reference, rendered from ``app.settings.Settings``: as Markdown for
``lora-gateway settings --reference`` (whose output is ``docs/settings.md``: ``make
settings-doc``), and as plain text for the epilog of ``lora-gateway --help``.

``tests/test_settings_reference.py`` fails while ``docs/settings.md`` differs from what the
command prints, so a setting added or changed without regenerating the page fails ``make test``.

Both show each field's variable, type, default and description, grouped by :data:`SECTIONS`.
Defaults are the class's, never the environment's or ``.env``'s, so the output is the same on
every machine; a secret's default is never shown.
"""

from __future__ import annotations

import enum
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from app.settings import Settings

REGENERATE = "make settings-doc  (lora-gateway settings --reference > docs/settings.md)"

# Each section's title and the field it starts at; a section runs, in the class's order, up to
# the next one's first field, so a field added anywhere lands in the section around it.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("Role in a deployment", "role"),
    ("Fair scheduler", "scheduler"),
    ("Base model and engine", "model"),
    ("Output constraints and tool calls", "structured_outputs_compact"),
    ("Store and administration", "database_url"),
    ("Quotas", "quota_url"),
    ("HTTP server", "host"),
    ("Connections", "request_head_timeout_seconds"),
)

_TYPE_NAMES: dict[Any, str] = {
    int: "integer",
    float: "number",
    bool: "boolean",
    str: "string",
    Path: "path",
    SecretStr: "secret",
}
_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_INTRO = """\
<!-- Generated from app/settings.py by `lora-gateway settings --reference`
     (make settings-doc); edit the fields' descriptions there, not this page. -->

# Settings

Every setting is an environment variable, `LORA_GATEWAY_` and the field's name in capitals,
also read from a `.env` file in the working directory (the environment wins). Booleans are
`true` or `false`. A name in a description such as `max_loras` is another setting on this page
(`LORA_GATEWAY_MAX_LORAS`). `lora-gateway settings --reference` prints this page and
`lora-gateway --help` the same variables as text; `lora-gateway settings` prints the values in
effect, as JSON.
"""


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``None``, and whether ``None`` was allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) < len(get_args(annotation)):
            inner = members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007
            return inner, True
    return annotation, False


def _is_secret(field: FieldInfo) -> bool:
    return _unwrap_optional(field.annotation)[0] is SecretStr


def _type(field: FieldInfo) -> str:
    annotation, _ = _unwrap_optional(field.annotation)
    if get_origin(annotation) is Literal:
        return " \\| ".join(f"`{_plain(value)}`" for value in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in annotation)
    name = _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    bounds = list(_bounds(field))
    return f"{name}, {', '.join(bounds)}" if bounds else name


def _bounds(field: FieldInfo) -> Iterator[str]:
    for constraint in field.metadata:
        if isinstance(constraint, Ge):
            yield f"≥ {_plain(constraint.ge)}"
        elif isinstance(constraint, Gt):
            yield f"> {_plain(constraint.gt)}"
        elif isinstance(constraint, Le):
            yield f"≤ {_plain(constraint.le)}"
        elif isinstance(constraint, Lt):
            yield f"< {_plain(constraint.lt)}"
        elif isinstance(constraint, MinLen) and constraint.min_length == 1:
            yield "not empty"
        elif isinstance(constraint, MinLen) and constraint.min_length > 1:
            yield f"at least {constraint.min_length} characters"
        elif isinstance(constraint, MaxLen):
            yield f"at most {constraint.max_length} characters"


def _plain(value: object) -> str:
    """A value as it would be written in the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, PurePath):
        return value.as_posix()
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def _default(name: str, field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if _is_secret(field):
        return "set (hidden)"
    if value == "":
        return "empty"
    shown = f"`{_plain(value)}`"
    if isinstance(value, int) and not isinstance(value, bool) and name.endswith("_bytes"):
        for unit, size in _BYTE_UNITS:
            if value >= size and value % size == 0:
                return f"{shown} ({value // size} {unit})"
    hours = isinstance(value, int | float) and value >= 3600 and value % 3600 == 0
    if hours and name.endswith("_seconds"):
        return f"{shown} ({int(value) // 3600} h)"
    return shown


def _cell(text: str) -> str:
    """``text`` on one line, safe in a table cell: outside code spans, ``<`` would open an HTML
    tag and ``*`` emphasis, so both are escaped; ``|`` is escaped everywhere (GFM's rule)."""
    parts = " ".join(text.split()).split("`")
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|")


def _sections(settings_class: type[BaseSettings]) -> Iterator[tuple[str, list[str]]]:
    members: list[str]
    names = list(settings_class.model_fields)
    starts = {first: title for title, first in SECTIONS}
    missing = sorted(set(starts) - set(names))
    if missing:
        raise ValueError(f"SECTIONS starts at fields Settings does not have: {missing}")
    if names and names[0] not in starts:
        raise ValueError(f"the first field, {names[0]}, must start a section in SECTIONS")
    title, members = "", []
    for name in names:
        if name in starts:
            if members:
                yield title, members
            title, members = starts[name], []
        members.append(name)
    if members:
        yield title, members


def render(settings_class: type[BaseSettings] = Settings) -> str:
    """The reference page for ``settings_class``'s fields, as Markdown."""
    prefix = str(settings_class.model_config.get("env_prefix", ""))
    fields = settings_class.model_fields
    lines = [_INTRO]
    for title, names in _sections(settings_class):
        lines += [f"## {title}", "", "| Variable | Type | Default | Description |"]
        lines.append("|---|---|---|---|")
        for name in names:
            field = fields[name]
            variable = f"`{prefix}{name.upper()}`"
            description = _cell(field.description or "")
            lines.append(
                f"| {variable} | {_type(field)} | {_default(name, field)} | {description} |"
            )
        lines.append("")
    return "\n".join(lines)


def _plain_text(markdown: str) -> str:
    """A description without Markdown's escapes and code spans' backticks."""
    return " ".join(markdown.split()).replace("`", "")


def help_text(settings_class: type[BaseSettings] = Settings, width: int = 100) -> str:
    """The same reference as :func:`render`, as plain text for ``--help``: per section, each
    variable with its type and default, its description wrapped below it."""
    prefix = str(settings_class.model_config.get("env_prefix", ""))
    fields = settings_class.model_fields
    lines = ["settings (environment variables, also read from ./.env; as Markdown:"]
    lines.append("lora-gateway settings --reference):")
    for title, names in _sections(settings_class):
        lines += ["", f"{title}:"]
        for name in names:
            field = fields[name]
            kind = _plain_text(_type(field)).replace("\\|", "|")
            default = _plain_text(_default(name, field))
            lines.append(f"  {prefix}{name.upper()}  ({kind}; default {default})")
            lines += textwrap.wrap(
                _plain_text(field.description or ""), width,
                initial_indent="      ", subsequent_indent="      ",
            )  # fmt: skip
    return "\n".join(lines)
