"""What tenants used: the ledger that records every request (:mod:`.ledger`) and the reports
read from it (:mod:`.reports`)."""

from app.usage.ledger import Fault, UsageLedger, UsageRecord
from app.usage.reports import (
    BucketGroup,
    BucketTotal,
    GroupBy,
    UsageTotal,
    top_tenants,
    usage_by_bucket,
    usage_totals,
)

__all__ = [
    "BucketGroup",
    "BucketTotal",
    "Fault",
    "GroupBy",
    "UsageLedger",
    "UsageRecord",
    "UsageTotal",
    "top_tenants",
    "usage_by_bucket",
    "usage_totals",
]
