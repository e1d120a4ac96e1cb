"""What the Batch API's tests share: a batch file's lines, and a batch polled to the end."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
from openai.types import Batch

FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
FAST_BATCHES = {"batch_poll_seconds": 0.05}
"""Settings that have a served gateway look for batches often."""


def chat_line(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], **body},
    }


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )


def read_jsonl(content: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in content.splitlines() if line.strip()]


async def submitted(
    api: openai.AsyncOpenAI, lines: list[Any], endpoint: str = "/v1/chat/completions"
) -> Batch:
    uploaded = await api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return await api.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )


async def finished(
    api: openai.AsyncOpenAI, batch_id: str, statuses: frozenset[str] = FINAL, timeout: float = 120
) -> Batch:
    """The batch once its status is one of ``statuses`` (``timeout`` bounds only a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        batch = await api.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        await asyncio.sleep(0.05)
