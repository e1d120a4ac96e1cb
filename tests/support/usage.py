"""Usage records the store tests write: one tenant's, on a fixed day."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from app.usage import UsageRecord

DAY = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
ACME_UID = "uid-of-acme"


def record(
    n: int, *, model: str, key: str, day: datetime, prompt: int, completion: int
) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{n}",
        tenant_id="acme",
        tenant_uid=ACME_UID,
        key_id=key,
        endpoint="chat.completions",
        model=model,
        adapter=None if model == "base" else model,
        adapter_version=1,
        prompt_tokens=prompt,
        completion_tokens=completion,
        status="ok",
        latency_ms=5,
        started_at=day,
        finished_at=day + timedelta(seconds=1),
    )
