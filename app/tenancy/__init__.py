"""Who is calling (API keys -> tenants) and what they may call (aliases -> adapters)."""
