"""Per-tenant (and per-key) quotas: requests and tokens per minute (GCRA), concurrent requests
(leases), and a token budget per calendar day or month, over interchangeable storages.

    backend = backend_from_url("redis://localhost:6379/0", fail_open=False, lease_seconds=60)
    reservation = await backend.reserve([(tenant, tenant_limits), (key, key_limits)], tokens)
    ...  # serve; call backend.renew(reservation) periodically for long streams
    await backend.reconcile(reservation, actual_tokens)
"""

from urllib.parse import urlsplit

from app.quota.backend import QuotaBackend
from app.quota.errors import QuotaBackendUnavailable, QuotaExceeded, QuotaTooLarge
from app.quota.limits import BudgetPeriod, LimitKind, Limits, QuotaUsage
from app.quota.memory import MemoryBackend
from app.quota.outcomes import Charge, Reservation
from app.quota.redis import RedisBackend


def backend_from_url(
    url: str = "memory://",
    *,
    fail_open: bool = False,
    lease_seconds: float = 60.0,
    key_prefix: str = "quota:",
) -> QuotaBackend:
    """The backend a URL names: ``memory://`` (one process) or ``redis://host:port/db``
    (also ``rediss://`` and ``unix://``), shared by every replica using the same Redis and
    ``key_prefix``. Redis Cluster is not supported: one reservation touches keys of
    several subjects."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryBackend(fail_open=fail_open, lease_seconds=lease_seconds)
    if scheme in ("redis", "rediss", "unix"):
        return RedisBackend.from_url(
            url, fail_open=fail_open, lease_seconds=lease_seconds, key_prefix=key_prefix
        )
    raise ValueError(f"unsupported quota storage URL {url!r} (memory:// or redis://)")


__all__ = [
    "BudgetPeriod",
    "Charge",
    "LimitKind",
    "Limits",
    "QuotaBackend",
    "QuotaBackendUnavailable",
    "QuotaExceeded",
    "QuotaTooLarge",
    "QuotaUsage",
    "Reservation",
    "backend_from_url",
]
