"""What happens around every engine request: in-flight accounting (so adapter
removal can wait), token counting as the engine streams, and the usage record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Literal

from vllm import RequestOutput

from app.serving.inflight import InFlight
from app.usage import UsageLedger, UsageRecord

if TYPE_CHECKING:
    from app.serving.generation import Generation


@dataclass
class Progress:
    """Completion tokens generated so far, per choice (outputs are deltas)."""

    tokens: dict[int, int] = field(default_factory=dict)

    def observe(self, output: RequestOutput) -> None:
        for choice in output.outputs:
            self.tokens[choice.index] = self.tokens.get(choice.index, 0) + len(choice.token_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens.values())


class RequestTracker:
    def __init__(self, in_flight: InFlight, ledger: UsageLedger) -> None:
        self.in_flight = in_flight
        self._ledger = ledger

    @contextmanager
    def track(self, generation: Generation) -> Iterator[Progress]:
        """Wrap one engine request; what it generated is recorded however it ends."""
        progress = Progress()
        started_at, started = datetime.now(timezone.utc), time.monotonic()
        status: Literal["ok", "cancelled", "error"] = "error"
        with self.in_flight.hold(generation.target.adapter):
            try:
                yield progress
                status = "ok"
            except (asyncio.CancelledError, GeneratorExit):
                status = "cancelled"
                raise
            finally:
                adapter = generation.target.adapter
                self._ledger.record(
                    UsageRecord(
                        request_id=generation.request_id,
                        tenant_id=generation.principal.tenant.id,
                        key_id=generation.principal.key_id,
                        endpoint=generation.endpoint,
                        model=generation.target.model,
                        adapter=adapter.name if adapter else None,
                        adapter_version=adapter.version if adapter else None,
                        prompt_tokens=generation.prompt_tokens,
                        completion_tokens=progress.completion_tokens,
                        status=status,
                        latency_ms=round((time.monotonic() - started) * 1000),
                        started_at=started_at,
                        finished_at=datetime.now(timezone.utc),
                    )
                )
