"""Per-tenant (and per-key) quotas: requests and tokens per minute (GCRA), concurrent requests
(leases), and a token budget per calendar day or month, over interchangeable storages.

    backend = backend_from_url("redis://localhost:6379/0", fail_open=False, lease_seconds=60)
    reservation = await backend.reserve([(tenant, tenant_limits), (key, key_limits)], tokens)
    ...  # serve; call backend.renew(reservation) periodically for long streams
    await backend.reconcile(reservation, actual_tokens)
"""

from app.quota.backend import Charge, QuotaBackend, Reservation, backend_from_url
from app.quota.errors import QuotaBackendUnavailable, QuotaExceeded, QuotaTooLarge
from app.quota.limits import BudgetPeriod, LimitKind, Limits, Usage

__all__ = [
    "BudgetPeriod",
    "Charge",
    "LimitKind",
    "Limits",
    "QuotaBackend",
    "QuotaBackendUnavailable",
    "QuotaExceeded",
    "QuotaTooLarge",
    "Reservation",
    "Usage",
    "backend_from_url",
]
