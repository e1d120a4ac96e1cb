"""Each adapter version's requests and failures per alias and minute, added up as the ledger
writes its records (:class:`~app.store.tables.VersionMinuteRow`): a rollback rule counts a
day of requests from at most 1,440 rows a version, not from the requests themselves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from app.store.tables import VersionMinuteRow

MinuteKey = tuple[str, str, str, int, datetime, str]
"""(tenant uid, alias, adapter, version, the minute its requests started in, finish reason)."""


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


Record = Mapping[str, Any]
"""A usage record's fields by name (``UsageRecord.as_dict()``)."""


def count_by_minute(records: Iterable[Record]) -> dict[MinuteKey, tuple[int, int]]:
    """Requests and failures by the version's doing, per key, of the records served by an
    adapter version."""
    requests: Counter[MinuteKey] = Counter()
    errors: Counter[MinuteKey] = Counter()
    for record in records:
        uid, adapter, version = record["tenant_uid"], record["adapter"], record["adapter_version"]
        if not uid or adapter is None or version is None:
            continue
        key = (
            uid,
            record["model"],
            adapter,
            version,
            minute_of(record["started_at"]),
            record["finish_reason"] or "",
        )
        requests[key] += 1
        errors[key] += record["status"] == "error" and record["fault"] == "version"
    return {key: (requests[key], errors[key]) for key in requests}


def add_version_minutes(connection: Connection, records: Iterable[Record]) -> None:
    """Add the usage ``records`` to the counts, in ``connection``'s transaction (the one that
    writes them)."""
    counts = count_by_minute(records)
    if not counts:
        return
    # In key order: replicas adding to the same rows at once lock them in one order.
    rows = [
        {
            "tenant_uid": uid,
            "model": model,
            "adapter": adapter,
            "adapter_version": version,
            "minute": minute,
            "finish_reason": reason,
            "requests": n,
            "errors": failed,
        }
        for (uid, model, adapter, version, minute, reason), (n, failed) in sorted(counts.items())
    ]
    _upsert(connection, rows)


def _upsert(connection: Connection, rows: list[dict[str, object]]) -> None:
    # Both dialects spell it ON CONFLICT ... DO UPDATE: concurrent replicas add, never lose.
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(VersionMinuteRow)
    statement = statement.on_conflict_do_update(
        index_elements=[
            "tenant_uid",
            "model",
            "adapter",
            "adapter_version",
            "minute",
            "finish_reason",
        ],
        set_={
            "requests": VersionMinuteRow.requests + statement.excluded.requests,
            "errors": VersionMinuteRow.errors + statement.excluded.errors,
        },
    )
    connection.execute(statement, rows)
