"""The counts an output constraint holds, read without compiling it.

A count costs what it counts, not what it takes to write: ``"maxItems": 10000000`` is 20
bytes, and llguidance spells out one array item per count when it compiles the schema (tens
of seconds and gigabytes, in the gateway's check and again in the engine). Array counts are
added over the schema, since each array is spelt out apart; every other count (a length, a
number of properties, a repetition bound ``{n,m}`` in a pattern, a regex or a grammar) is
bounded one by one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.errors import BadRequestError

ARRAY_COUNTS = ("maxItems", "minItems")
OTHER_COUNTS = ("maxLength", "minLength", "maxProperties", "minProperties")
# Values that are data, not schemas: a count inside them bounds nothing.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
REPETITION = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


@dataclass(frozen=True)
class CountLimits:
    array_items: int = 4096
    count: int = 32_768

    def check_schema(self, schema: Any, param: str) -> None:
        """Refuse ``schema`` (a 400 naming ``param``, the keyword, where it is and the limit)
        if its arrays ask for more items than ``array_items`` in all, or another count is
        over ``count``. Its patterns are regexes: :meth:`check_repetitions` each."""
        items = 0
        for path, keyword, value in _counts(schema):
            where = f"`{keyword}` {value} at `{_pointer(path)}`"
            if keyword not in ARRAY_COUNTS:
                self._check_count(value, where, param)
                continue
            items += value
            if items > self.array_items:
                raise BadRequestError(
                    f"`{param}` asks for more than {self.array_items:,} array items in all "
                    f"({where}); this server allows at most {self.array_items:,} in one "
                    "constraint, added over its arrays.",
                    param=param,
                )

    def check_repetitions(self, text: str, param: str, where: str = "it") -> None:
        """Refuse a repetition bound ``{n}``/``{n,m}`` in ``text`` (a regex or a grammar) over
        ``count``. An escaped brace is a literal and bounds nothing; a brace in a quoted
        literal of a grammar may be read as a bound, which only refuses more."""
        for match in REPETITION.finditer(text):
            if _escaped(text, match.start()):
                continue
            for number in match.groups():
                if number and int(number) > self.count:
                    self._check_count(int(number), f"{where} repeats `{match.group()}`", param)

    def _check_count(self, value: int, what: str, param: str) -> None:
        if value > self.count:
            raise BadRequestError(
                f"`{param}`: {what}; this server allows counts up to {self.count:,}.",
                param=param,
            )


def patterns(schema: Any) -> Iterator[tuple[str, str]]:
    """The regular expressions in ``schema`` (``pattern`` values, ``patternProperties``
    keys), each with what it is and where, for an error to name."""
    for path, item in _schemas(schema):
        pattern = item.get("pattern")
        if isinstance(pattern, str):
            yield f"a `pattern` at `{_pointer(path)}`", pattern
        properties = item.get("patternProperties")
        if isinstance(properties, dict):
            where = f"a `patternProperties` key at `{_pointer(path)}`"
            yield from ((where, key) for key in properties)


def _counts(schema: Any) -> Iterator[tuple[tuple[str, ...], str, int]]:
    """(where, keyword, value) of every count in ``schema``: of an array's two the larger,
    which is the one spelt out; integers, a float with an integral value included (JSON
    Schema takes one)."""
    for path, item in _schemas(schema):
        arrays = [(key, n) for key in ARRAY_COUNTS if (n := _integer(item.get(key))) is not None]
        if arrays:
            yield path, *max(arrays, key=lambda count: count[1])
        for key in OTHER_COUNTS:
            count = _integer(item.get(key))
            if count is not None:
                yield path, key, count


def _schemas(schema: Any) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every object in ``schema`` with where it is, walked without recursion (the request's
    size bounds the walk, not Python's stack), data values (``const``, ``enum``...) left
    out."""
    pending: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, list):
            pending.extend(((*path, str(i)), child) for i, child in enumerate(item))
        elif isinstance(item, dict):
            yield path, item
            pending.extend(((*path, k), v) for k, v in item.items() if k not in DATA_KEYWORDS)


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index > backslashes and text[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _pointer(path: tuple[str, ...]) -> str:
    return "/" + "/".join(path)
