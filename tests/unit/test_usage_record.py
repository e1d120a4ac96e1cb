"""A usage record's fields, as the ledger inserts and logs them."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from app.usage import UsageRecord


def test_as_dict_is_every_field_by_name() -> None:
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    record = UsageRecord(
        request_id="r",
        tenant_id="t",
        tenant_uid="u1",
        key_id="k",
        endpoint="chat",
        model="m",
        adapter="a",
        adapter_version=2,
        prompt_tokens=3,
        completion_tokens=4,
        status="ok",
        latency_ms=5,
        started_at=now,
        finished_at=now,
        user="u",
    )
    assert record.as_dict() == dataclasses.asdict(record)
    assert record.as_dict()["started_at"] is now
