"""One compile-check process per tokenizer for every gateway a test process serves.

A gateway starts its own check of output constraints (``app/serving/preparation/
grammar_check.py``: a Python child that imports llguidance and builds the tokenizer) and
waits for it before it is ready: about 0.2 s of each start, and a process's start in CPU,
for each of the hundreds of gateways a test process starts and stops. Shared, the check is
started once per tokenizer and CPU budget and kept until the process exits; the gateways'
requests still get llguidance's verdicts, within the budget, from a process of its own. The
tests of the check itself (``tests/serving/preparation/test_grammar_check.py``) use
``GrammarCheck`` directly, and a gateway in a process of its own (``lora-gateway serve``,
tests/support/scripted_gateway.py) starts its own."""

from __future__ import annotations

import atexit
import threading
from types import TracebackType
from typing import Any

from app.serving.preparation import structured
from app.serving.preparation.grammar_check import GrammarCheck, TokenizerSpec

_shared: dict[tuple[TokenizerSpec, float], GrammarCheck] = {}
_lock = threading.Lock()


class SharedGrammarCheck:
    """In ``GrammarCheck``'s place for the gateways: entering it hands out this process's
    check for the tokenizer and budget (started on first use); leaving it stops nothing."""

    def __init__(self, tokenizer: Any, cpu_seconds: float) -> None:
        self._key = (TokenizerSpec.of(tokenizer), cpu_seconds)
        self._tokenizer = tokenizer

    def __enter__(self) -> GrammarCheck:
        with _lock:
            check = _shared.get(self._key)
            if check is None:
                check = _shared[self._key] = GrammarCheck(self._tokenizer, self._key[1])
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


def share_grammar_checks() -> None:
    """Every gateway this process serves from now on shares its compile checks."""
    structured.GrammarCheck = SharedGrammarCheck  # type: ignore[assignment,misc]
