"""Engine fronts: ``LLM`` (offline), ``AsyncEngine`` (asyncio + step thread), the FAKE echo engine."""
