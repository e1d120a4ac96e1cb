"""Scenario (f)'s workload, without a server: the batch's lines over (a)'s mix, the JSONL file
its tenant uploads, and one record per line read back from the batch's output and error
files, so that a batch is a sample like any other (bench/stats.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.client import CHAT_PATH, RequestRecord
from bench.workload import Mix, PlannedRequest, WorkloadSpec, closed_plan, plan


@dataclass(frozen=True)
class BatchSizes:
    """What scenario (f) runs: a batch of ``lines`` lines over (a)'s adapters, popularity,
    base-model share and prompts, each with ``line_tokens`` output tokens ((a)'s own by
    default, as issue #52 asks), beside (a)'s interactive load at ``load`` of (a)'s saturation
    (measured at ``saturation_concurrency``). The batch alone is compared with its lines sent
    online at ``online_concurrency``."""

    lines: int = 2000
    line_tokens: int = 32
    load: float = 0.5
    adapters: int = 32
    zipf: float = 1.0
    base_share: float = 0.2
    output_tokens: int = 32  # (a)'s, of the interactive requests
    saturation_concurrency: int = 64
    saturation_waves: int = 2
    online_concurrency: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lines < 1 or self.line_tokens < 1:
            raise ValueError("a batch needs at least one line of at least one token")
        if not 0 < self.load < 1:
            raise ValueError("the interactive load is a share of saturation in (0, 1)")
        if min(self.saturation_concurrency, self.saturation_waves, self.online_concurrency) < 1:
            raise ValueError("concurrencies and waves must be positive")

    def interactive_mix(self) -> Mix:
        return Mix(self.adapters, self.zipf, self.base_share, self.output_tokens, self.seed)

    def saturation_plan(self) -> list[PlannedRequest]:
        """(a)'s closed loop: ``saturation_waves`` x its concurrency requests."""
        count = self.saturation_waves * self.saturation_concurrency
        return closed_plan(self.interactive_mix(), count)

    def batch_plan(self) -> list[PlannedRequest]:
        """The batch's lines: (a)'s mix with ``line_tokens`` output tokens each, drawn from
        their own seed so that they are not the interactive requests over again."""
        mix = Mix(self.adapters, self.zipf, self.base_share, self.line_tokens, self.seed + 1)
        return closed_plan(mix, self.lines)

    def interactive_plan(self, rate: float, seconds: float, round_: int) -> list[PlannedRequest]:
        """(a)'s open loop at ``rate`` req/s for ``seconds``, its arrivals drawn anew each
        round."""
        mix = self.interactive_mix()
        return plan(
            WorkloadSpec(
                mix.adapters, mix.zipf, mix.base_share, mix.output_tokens, mix.seed + round_,
                rate=rate, duration=seconds,
            )
        )  # fmt: skip


def custom_id(index: int) -> str:
    return f"line-{index:05d}"


def index_of(custom: str) -> int | None:
    prefix, _, number = custom.partition("-")
    return int(number) if prefix == "line" and number.isdigit() else None


def batch_line(planned: PlannedRequest, model: str) -> dict[str, Any]:
    """One line of the input file: the chat request the online client sends for ``planned``,
    unstreamed (greedy, ``ignore_eos``: every line generates exactly its ``max_tokens``)."""
    return {
        "custom_id": custom_id(planned.index),
        "method": "POST",
        "url": CHAT_PATH,
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": planned.prompt}],
            "max_tokens": planned.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    }


def batch_file(lines: Sequence[PlannedRequest], model_of: Callable[[PlannedRequest], str]) -> bytes:
    return b"".join(
        json.dumps(batch_line(p, model_of(p)), separators=(",", ":")).encode() + b"\n"
        for p in lines
    )


def batch_records(
    system: str,
    point: str,
    lines: Sequence[PlannedRequest],
    model_of: Callable[[PlannedRequest], str],
    output: str,
    errors: str,
) -> list[RequestRecord]:
    """One record per planned line, in the plan's order: answered (status 200 in the output
    file) with its completion tokens, or failed with the error file's message. A line in
    neither file, or answered twice, is an error too: each must come back exactly once."""
    seen: dict[int, list[dict[str, Any]]] = {}
    for text in (output, errors):
        for raw in text.splitlines():
            if raw.strip():
                entry = json.loads(raw)
                index = index_of(str(entry.get("custom_id", "")))
                if index is not None:
                    seen.setdefault(index, []).append(entry)
    records = []
    for planned in lines:
        record = RequestRecord(system, point, planned.index, planned.tenant, model_of(planned), 0.0)
        entries = seen.get(planned.index, [])
        if len(entries) != 1:
            record.error = f"came back {len(entries)} times"
        else:
            response = entries[0].get("response") or {}
            body = response.get("body") or {}
            record.status = response.get("status_code")
            if record.status != 200 or entries[0].get("error"):
                error = entries[0].get("error") or body.get("error") or {}
                message = error.get("message", error) if isinstance(error, dict) else error
                record.error = f"HTTP {record.status}: {message}"
            else:
                usage = body.get("usage") or {}
                record.output_tokens = int(usage.get("completion_tokens", 0))
                record.prompt_tokens = usage.get("prompt_tokens")
        records.append(record)
    return records
