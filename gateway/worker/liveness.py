"""Whether a worker's tier status is alive, judged on this process's own clock.

Each worker stamps its status (``tier_status.py``) with its own ``time.time()``; comparing
that stamp with another host's clock makes a worker whose clock runs ahead (or behind) look
alive (or dead) when it is not. A status is republished every second and its ``ts`` changes
each time, so ``StatusAges`` judges by change instead: it remembers each field's last value
and when, on the observer's ``time.monotonic()``, that value last changed. A field seen for
the first time counts as just changed (a worker is given ``STALE_AFTER_S`` to show it is
silent); a field that left the hash is forgotten.
"""

from __future__ import annotations

from typing import Any

from gateway.bus.client import text


class StatusAges:
    def __init__(self) -> None:
        # field -> (last value, changed at, seen to change: not only sighted)
        self._seen: dict[str, tuple[Any, float, bool]] = {}

    def observe(self, statuses: dict[Any, Any], now: float) -> None:
        """Record the status hash as read now (``now``: this process's monotonic clock)."""
        seen: dict[str, tuple[Any, float, bool]] = {}
        for key, value in statuses.items():
            name = text(key)
            prev = self._seen.get(name)
            seen[name] = (value, now, False) if prev is None else (
                prev if prev[0] == value else (value, now, True))
        self._seen = seen

    def fresh(self, now: float, within_s: float) -> set[str]:
        """The fields whose value changed in the last ``within_s`` seconds."""
        return {name for name, (_, at, _) in self._seen.items() if now - at <= within_s}

    def changing(self, now: float, within_s: float) -> set[str]:
        """``fresh``, less the fields only sighted so far (not yet seen to change)."""
        return {name for name, (_, at, changed) in self._seen.items()
                if changed and now - at <= within_s}

    def unchanged(self, now: float, for_s: float) -> set[str]:
        """The fields whose value has not changed for longer than ``for_s`` seconds."""
        return {name for name, (_, at, _) in self._seen.items() if now - at > for_s}
