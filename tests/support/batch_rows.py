"""A batch's row as the API creates it, for the store's tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from app.store.batches import new_batch_id
from app.store.files import new_file_id
from app.store.tables import BatchRow


def batch_row(
    tenant_uid: str = "uid-a", tenant_id: str = "a", created_at: datetime | None = None
) -> BatchRow:
    """A batch just created (``validating``, no lines yet) of the tenant, expiring a day after
    ``created_at`` (now, unless given)."""
    created_at = created_at or datetime.now(timezone.utc)
    return BatchRow(
        id=new_batch_id(),
        tenant_uid=tenant_uid,
        tenant_id=tenant_id,
        key_id="key",
        endpoint="/v1/chat/completions",
        input_file_id=new_file_id(),
        completion_window="24h",
        status="validating",
        total=0,
        completed=0,
        failed=0,
        created_at=created_at,
        expires_at=created_at + timedelta(days=1),
    )
