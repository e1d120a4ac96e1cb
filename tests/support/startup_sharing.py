"""What the gateways a test process serves share of their start-up, done once per process
rather than at each of the hundreds of starts.

- The compile check of output constraints (``app/serving/preparation/grammar_check.py``): a
  gateway starts a Python child that imports llguidance and builds the tokenizer, and waits
  for it before it is ready (about 0.2 s a start, and a process's start in CPU; over a real
  tokenizer, a second or more). Shared, one is started per tokenizer and CPU budget and kept
  until the process exits: requests still get llguidance's verdicts, within the budget, from
  a process of its own.
- The front role's tokenizer (``app/serving/front/backend.py``), loaded from the model
  directory (0.7 s), then read for its longest token (0.3 s) and its compile check's
  description (0.5 s): a loaded one is lent to one front at a time, and taken back when
  that front stops (a Hugging Face tokenizer is not safe to share between threads, and each
  front tokenizes on a thread of its own).

The tests of the check itself (``tests/serving/preparation/test_grammar_check.py``) use
``GrammarCheck`` directly, and a gateway in a process of its own (``lora-gateway serve``,
tests/support/scripted_gateway.py) starts its own."""

from __future__ import annotations

import atexit
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any

from app.serving.front import backend as front_backend
from app.serving.preparation import structured
from app.serving.preparation.grammar_check import GrammarCheck, TokenizerSpec
from app.serving.preparation.per_tokenizer import per_tokenizer

_checks: dict[tuple[TokenizerSpec, float], GrammarCheck] = {}
_lock = threading.Lock()
_spec_of = per_tokenizer(TokenizerSpec.of)  # a real tokenizer's takes half a second


class SharedGrammarCheck:
    """In ``GrammarCheck``'s place for the gateways: entering it hands out this process's
    check for the tokenizer and budget (started on first use); leaving it stops nothing."""

    def __init__(self, tokenizer: Any, cpu_seconds: float) -> None:
        self._tokenizer = tokenizer
        self._cpu_seconds = cpu_seconds

    def __enter__(self) -> GrammarCheck:
        key = (_spec_of(self._tokenizer), self._cpu_seconds)
        with _lock:
            check = _checks.get(key)
            if check is None:
                check = _checks[key] = GrammarCheck(self._tokenizer, self._cpu_seconds)
                check.__enter__()
                atexit.register(check.__exit__, None, None, None)
            return check

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


_load_tokenizer = front_backend.get_tokenizer  # type: ignore[attr-defined]
_free_tokenizers: dict[str, list[Any]] = {}
# The tokenizers a front being opened took: the open's lifespan task sets it, and the thread
# that loads the tokenizer sees it (asyncio.to_thread runs in a copy of the task's context).
_taken: ContextVar[list[tuple[str, Any]] | None] = ContextVar("taken", default=None)


def _lent_tokenizer(path: str) -> Any:
    """In ``get_tokenizer``'s place for the fronts: a free tokenizer of ``path``, or one
    loaded now."""
    with _lock:
        free = _free_tokenizers.setdefault(path, [])
        tokenizer = free.pop() if free else None
    if tokenizer is None:
        tokenizer = _load_tokenizer(path)
    taken = _taken.get()
    if taken is not None:
        taken.append((path, tokenizer))
    return tokenizer


_open_front = front_backend.FrontFactory.open


@asynccontextmanager
async def _open_front_lending(self: Any, *args: Any) -> AsyncIterator[Any]:
    """``FrontFactory.open``, whose tokenizer is given back once the front stops."""
    taken: list[tuple[str, Any]] = []
    token = _taken.set(taken)
    lending = True
    try:
        async with _open_front(self, *args) as front:
            _taken.reset(token)
            lending = False
            yield front
    finally:
        if lending:
            _taken.reset(token)
        with _lock:
            for path, tokenizer in taken:
                _free_tokenizers[path].append(tokenizer)


def share_startup_work() -> None:
    """Every gateway this process serves from now on shares its compile checks and, in the
    front role, its tokenizer's loading."""
    structured.GrammarCheck = SharedGrammarCheck  # type: ignore[assignment, attr-defined]
    front_backend.get_tokenizer = _lent_tokenizer  # type: ignore[attr-defined, assignment]
    front_backend.FrontFactory.open = _open_front_lending  # type: ignore[method-assign, assignment]
