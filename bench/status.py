"""One live status line on stderr while the benchmark runs (it takes minutes)."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field


@dataclass
class StatusLine:
    total_requests: int
    done: int = 0
    system: str = "-"
    phase: str = "preparing"
    started: float = field(default_factory=time.perf_counter)
    # Without a terminal, \r-redrawing would pile up in a log: print a full
    # line every few seconds instead.
    interactive: bool = field(default_factory=sys.stderr.isatty)

    def line(self) -> str:
        elapsed = int(time.perf_counter() - self.started)
        return (
            f"bench {elapsed // 60:02d}:{elapsed % 60:02d}"
            f"  requests {self.done}/{self.total_requests}"
            f"  {self.system}: {self.phase}"
        )

    def count(self, _: object = None) -> None:
        """One more request ended (a client's on_finished callback)."""
        self.done += 1

    def set(self, system: str, phase: str) -> None:
        self.system, self.phase = system, phase
        self.draw(force=not self.interactive)

    def note(self, message: str) -> None:
        """A message on its own line, the live line redrawn below it."""
        sys.stderr.write(("\r\033[K" if self.interactive else "") + message + "\n")
        self.draw()

    def draw(self, force: bool = True) -> None:
        if self.interactive:
            sys.stderr.write("\r\033[K" + self.line())
        elif force:
            sys.stderr.write(self.line() + "\n")
        sys.stderr.flush()

    async def run(self, interval: float) -> None:
        """Redraw until cancelled (every ``interval`` s; 10x rarer without a terminal)."""
        ticks = 0
        while True:
            await asyncio.sleep(interval)
            ticks += 1
            self.draw(force=self.interactive or ticks % 10 == 0)

    def finish(self) -> None:
        if self.interactive:
            sys.stderr.write("\n")
            sys.stderr.flush()
