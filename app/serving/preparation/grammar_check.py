"""llguidance's compile of a request's output constraint, checked before the request is
admitted, in a process of its own and within a CPU budget.

Why a process: a compile runs in Rust for as long as its grammar asks, and a thread cannot be
stopped; it would hold its CPU, and keep what it allocated, however long it took. The child
reports the CPU each compile took (a compile past the budget is refused). One still running
past the budget is killed, and a new child started in the same call: the tenant whose
constraint it was waits for that, no one else. The child imports llguidance and this module
only (``python -m``, not multiprocessing's spawn, which would import the server's
``__main__``), and builds the tokenizer once from a description sent at its start.

Linux: the watchdog reads the child's CPU time from ``/proc``.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any

from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

# The package root the child imports this module from: the parent's own.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
STARTUP_SECONDS = 120.0  # bounds a child that never comes up (building the tokenizer: ~1 s)
WATCH_SECONDS = 0.005
CLOCK_TICK = 1 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class TokenizerSpec:
    """What the child needs to build llguidance's tokenizer: a Hugging Face fast tokenizer's
    serialized form, or the token table of one that lists its tokens' bytes itself (the
    stand-in engines')."""

    vocabulary: int
    eos_token_id: int
    serialized: str | None = None
    tokens: tuple[bytes, ...] = ()
    bos_token_id: int | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerSpec:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # as llguidance.hf.from_tokenizer reads it
            backend = copy.copy(backend)
            backend.no_padding()
            backend.no_truncation()
            return cls(len(tokenizer), tokenizer.eos_token_id, serialized=backend.to_str())
        return cls(
            len(tokenizer),
            tokenizer.eos_token_id,
            tokens=tuple(tokenizer.tokens),
            bos_token_id=tokenizer.bos_token_id,
        )

    def build(self) -> LLTokenizer:
        if self.serialized is not None:
            return LLTokenizer(
                self.serialized, n_vocab=self.vocabulary, eos_token=self.eos_token_id
            )
        return LLTokenizer(TokenizerWrapper(_TokenTable(self)))


class _TokenTable:
    """A tokenizer given by its token table alone, as llguidance's wrapper takes one: text is
    encoded greedily, longest token first (llguidance encodes only to check literals)."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.tokens = list(spec.tokens)
        self.eos_token_id = spec.eos_token_id
        self.bos_token_id = spec.bos_token_id
        self._ids = {token: i for i, token in reversed(list(enumerate(self.tokens)))}
        self._longest = max(map(len, self.tokens), default=1)

    def __call__(self, text: bytes) -> list[int]:
        ids, at = [], 0
        while at < len(text):
            for size in range(min(self._longest, len(text) - at), 0, -1):
                token = self._ids.get(text[at : at + size])
                if token is not None:
                    ids.append(token)
                    at += size
                    break
            else:
                at += 1  # a byte no token spells: skipped
        return ids


class GrammarCheck:
    """Checks grammars (llguidance's serialized form) against one tokenizer, one at a time,
    each within ``cpu_seconds`` of CPU. A context manager: the child ends with the block."""

    def __init__(self, tokenizer: Any, cpu_seconds: float) -> None:
        self._spec = TokenizerSpec.of(tokenizer)
        self.cpu_seconds = cpu_seconds
        self._lock = threading.Lock()
        self._child: _Child | None = None

    def __enter__(self) -> GrammarCheck:
        with self._lock:
            self._child = _Child(self._spec)  # started now, ready by the first check
        return self

    def warm(self) -> None:
        """Wait until the child is ready (its tokenizer built), which the first check would
        otherwise wait for."""
        with self._lock:
            if self._child is not None:
                self._child.wait_ready()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            if self._child is not None:
                self._child.stop()
                self._child = None

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def refusal(self, grammar: str) -> str | None:
        """Why the engine could not enforce ``grammar`` (llguidance's reason, or the budget
        it went past), or ``None``: it compiles and its first token mask can be computed.
        Blocks its caller for the check, and for a restart after a child was stopped."""
        with self._lock:
            if self._child is None:
                raise RuntimeError("the grammar check is closed")
            try:
                reason, seconds = self._child.check(grammar, self.cpu_seconds)
            except _OverBudget:
                self._child.stop()
                self._child = _Child(self._spec)
                self._child.wait_ready()
                return self._over_budget()
            return self._over_budget() if seconds > self.cpu_seconds else reason

    def _over_budget(self) -> str:
        return f"it takes more than {self.cpu_seconds * 1000:.0f} ms of CPU to compile"


class _OverBudget(Exception):
    pass


class _Child:
    def __init__(self, spec: TokenizerSpec) -> None:
        ours, theirs = socket.socketpair()
        env = os.environ | {"PYTHONPATH": os.pathsep.join(_paths())}
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._connection = Connection(ours.detach())
        self._spec: TokenizerSpec | None = spec  # sent by the first caller that waits
        self.pid = self._process.pid

    def wait_ready(self) -> None:
        if self._spec is None:
            return
        self._connection.send(self._spec)
        self._spec = None
        if not self._connection.poll(STARTUP_SECONDS):
            raise RuntimeError("the grammar check's process did not start")
        self._connection.recv()

    def check(self, grammar: str, cpu_seconds: float) -> tuple[str | None, float]:
        """The child's answer for ``grammar`` and the CPU it took; :class:`_OverBudget` once
        its CPU time is past ``cpu_seconds`` by more than the clock's resolution."""
        self.wait_ready()
        began = self._cpu_seconds()
        self._connection.send(grammar)
        while not self._connection.poll(WATCH_SECONDS):
            if self._cpu_seconds() - began > cpu_seconds + 2 * CLOCK_TICK:
                raise _OverBudget
            if self._process.poll() is not None:
                raise _OverBudget  # it died compiling (out of memory, say)
        reason, seconds = self._connection.recv()
        return reason, seconds

    def stop(self) -> None:
        self._process.kill()
        self._process.wait()
        self._connection.close()

    def _cpu_seconds(self) -> float:
        try:
            stat = Path(f"/proc/{self._process.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * CLOCK_TICK  # utime, stime


def _paths() -> list[str]:
    inherited = os.environ.get("PYTHONPATH")
    return [str(PACKAGE_ROOT), *([inherited] if inherited else [])]


def _serve(connection: Connection) -> None:
    """The child: build the tokenizer, then answer each grammar with (reason, CPU seconds)
    until the parent goes."""
    tokenizer = connection.recv().build()
    connection.send("ready")
    while True:
        try:
            grammar = connection.recv()
        except EOFError:
            return
        began = time.process_time()
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if not matcher.is_error():
            matcher.compute_bitmask()
        reason = None
        if matcher.is_error():  # its first line: the rest dumps parser state
            reason = (matcher.get_error().strip().splitlines() or ["no reason given"])[0]
        del matcher
        connection.send((reason, time.process_time() - began))


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
