"""The persistent store: tenants, keys, adapters, grants, quotas and the audit log."""
