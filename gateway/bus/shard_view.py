"""What a process knows of the shards' part of each tier (``keys.py``): the worker's backlog
view, which plans its fair pick across shards, and the gateway's depth view, which admission
checks a tier's ``queue_max_len`` with. Plain bookkeeping; ``queues.py`` reads Redis."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

# the least-counter backlogged tenants a backlog read lists per shard and tier: the pick
# chooses among these (its keys must be declared), so up to this many picks a round are exact
CANDIDATES = 32
DEPTH_REFRESH_S = 0.5


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class BacklogView:
    """Per tier and shard: entries waiting and the least-counter backlogged tenants, as the
    last backlog read saw them; and the worker's virtual time per tier (the counter it last
    picked at, over every shard)."""

    candidates = CANDIDATES

    def __init__(self, tiers: Sequence[str], shards: int) -> None:
        self.tiers = tuple(tiers)
        self.shards = shards
        self._n: dict[str, dict[int, int]] = {t: {} for t in self.tiers}
        self._cands: dict[str, dict[int, list[tuple[str, float]]]] = {t: {} for t in self.tiers}
        self._vt: dict[str, tuple[float, str]] = {}
        self._turn: dict[str, dict[int, int]] = {t: {} for t in self.tiers}
        self._round = 0
        self.fresh = False  # read since the last pick round: a pick may plan with it

    def update(self, shard: int, per_tier: Sequence[Any]) -> None:
        """One shard's ``BACKLOG_LUA`` reply: per tier, {count, {tenant, counter, ...}}."""
        for tier, (n, flat) in zip(self.tiers, per_tier):
            self._n[tier][shard] = int(n)
            names = [_text(x) for x in flat[::2]]
            self._cands[tier][shard] = [(t, float(_text(c))) for t, c in zip(names, flat[1::2])]

    def busy(self) -> set[int]:
        """The shards with entries of any tier not yet picked, as last read."""
        return {s for tier in self._n for s in self.busy_shards(tier)}

    def busy_shards(self, tier: str) -> list[int]:
        """The shards with entries of ``tier`` not yet picked, as last read."""
        return sorted(s for s, n in self._n.get(tier, {}).items() if n > 0)

    def totals(self) -> dict[str, int]:
        return {t: sum(self._n[t].values()) for t in self.tiers}

    def empty(self, tier: str) -> bool:
        return not any(self._n.get(tier, {}).values())

    def next_shard(self, tier: str, skip: frozenset[str]) -> tuple[int, list[str], str] | None:
        """The shard to pick from next, its candidate tenants and the ceiling (the least
        counter of the other shards, '' if none): the shards ordered by their least candidate
        counter raised to the virtual time, ties to the shard picked longest ago."""
        vt = self._vt.get(tier, (0.0, ""))[0]
        ready = []
        for s, n in self._n[tier].items():
            cands = [(t, c) for t, c in self._cands[tier].get(s, []) if t not in skip]
            if n > 0 and cands:
                least = max(min(c for _, c in cands), vt)
                ready.append((least, self._turn[tier].get(s, -1), s, [t for t, _ in cands]))
        if not ready:
            return None
        ready.sort()
        self._round += 1
        s = ready[0][2]
        self._turn[tier][s] = self._round
        return s, ready[0][3], repr(ready[1][0]) if len(ready) > 1 else ""

    def virtual_time(self, tier: str) -> str:
        """The counter to lift a pick's candidates to ('' with one shard: the fair queue's
        own lift is exact there)."""
        if self.shards == 1:
            return ""
        return self._vt.get(tier, (0.0, ""))[1]

    def picked(self, tier: str, shard: int, asked: int, ats: Iterable[str],
               left: Sequence[Any]) -> None:
        """A pick from ``shard`` gave entries picked at counters ``ats``; ``left``: its
        candidates still backlogged, {tenant, counter, ...}. None picked means the shard has
        nothing more to give until the next read."""
        ats = list(ats)
        n = self._n[tier].get(shard, 0)
        self._n[tier][shard] = 0 if not ats else max(0, n - len(ats))
        names = [_text(x) for x in left[::2]]
        self._cands[tier][shard] = [(t, float(_text(c))) for t, c in zip(names, left[1::2])]
        if ats:
            low = min(ats, key=float)
            if float(low) > self._vt.get(tier, (0.0, ""))[0]:
                self._vt[tier] = (float(low), low)


class DepthView:
    """A gateway's view of each shard's queued + running entries per tier: its own
    admissions' replies at once, the other gateways' at the next refresh."""

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self._depth: dict[str, dict[int, int]] = {}
        self._at = float("-inf")

    def stale(self) -> bool:
        return time.monotonic() - self._at > DEPTH_REFRESH_S

    def refreshed(self, per_shard: Sequence[dict[Any, Any]]) -> None:
        """Every shard's depth hash (tier -> entries), in shard order."""
        self._depth = {}
        for s, raw in enumerate(per_shard):
            for tier, n in raw.items():
                if not _text(tier).startswith("b:"):  # 'b:' fields: entries not yet picked
                    self._depth.setdefault(_text(tier), {})[s] = int(n)
        self._at = time.monotonic()

    def others(self, tier: str, shard: int) -> int:
        d = self._depth.get(tier, {})
        return sum(d.values()) - d.get(shard, 0)

    def set(self, tier: str, shard: int, n: int) -> None:
        self._depth.setdefault(tier, {})[shard] = n
