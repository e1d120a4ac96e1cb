"""What is computed once per tokenizer: a pass over its vocabulary takes a fraction of a second,
too long for a request's path."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def per_tokenizer(build: Callable[[Any], T]) -> Callable[[Any], T]:
    """``build(tokenizer)``, computed the first time for each tokenizer object."""
    known: dict[int, tuple[Any, T]] = {}

    @functools.wraps(build)
    def cached(tokenizer: Any) -> T:
        entry = known.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = known[id(tokenizer)] = (tokenizer, build(tokenizer))
        return entry[1]

    return cached
