"""Progress lines for set-up steps that take more than a few seconds."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def step(message: str) -> Iterator[None]:
    say(f"{message} ...")
    started = time.perf_counter()
    yield
    say(f"{message}: done in {time.perf_counter() - started:.1f}s")


def bar(label: str, done: int, total: int, suffix: str = "") -> None:
    """Redraw one progress line in place (a newline when finished)."""
    width = 24
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    sys.stderr.write(
        f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {suffix}{end}"
    )
    sys.stderr.flush()
