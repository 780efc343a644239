"""Tenants, API keys and quotas (stored in Redis, checked on every request)."""
