"""A queue of requests kept in (priority, arrival) order. Torch-free.

Sorted list + bisect: O(log n) search, O(n) memmove on insert/remove (fast in practice for
thousands of entries), and in-order iteration for the scheduler's admission phases.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Iterator

from engine.core.request import Request

_Key = tuple[int, float, int]


class RequestQueue:
    def __init__(self) -> None:
        self._keys: list[_Key] = []
        self._reqs: list[Request] = []
        self._key_of: dict[str, _Key] = {}
        self._seq = itertools.count()  # tie-break: insertion order
        self._by_arrival: list[tuple[float, int, str]] = []  # heap, lazily pruned
        # requests per priority, kept as they come and go: the engine's stats read them every
        # step, and counting the queue each time cost O(n) (0.4 ms a step at 400 waiting)
        self._priorities: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self._reqs)

    def __bool__(self) -> bool:
        return bool(self._reqs)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._reqs))  # a snapshot: callers remove while iterating

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._key_of

    def add(self, request: Request) -> None:
        if request.request_id in self._key_of:
            raise ValueError(f"request {request.request_id!r} already queued")
        key = (request.priority, request.arrival_time, next(self._seq))
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._reqs.insert(i, request)
        self._key_of[request.request_id] = key
        heapq.heappush(self._by_arrival, (key[1], key[2], request.request_id))
        self._priorities[key[0]] += 1

    def peek(self) -> Request | None:
        return self._reqs[0] if self._reqs else None

    def remove(self, request_id: str) -> Request | None:
        key = self._key_of.pop(request_id, None)
        if key is None:
            return None
        i = bisect.bisect_left(self._keys, key)
        del self._keys[i]
        self._priorities[key[0]] -= 1
        if not self._priorities[key[0]]:
            del self._priorities[key[0]]
        return self._reqs.pop(i)

    def by_priority(self) -> tuple[tuple[int, int], ...]:
        """``(priority, count)`` of the queued requests, ascending by priority (the form
        ``policies.admission.by_priority`` gives)."""
        return tuple(sorted(self._priorities.items()))

    def oldest_arrival(self) -> float | None:
        """Earliest arrival time among queued requests (not necessarily the head)."""
        heap = self._by_arrival
        while heap:
            arrival, seq, rid = heap[0]
            key = self._key_of.get(rid)
            if key is not None and key[2] == seq:
                return arrival
            heapq.heappop(heap)  # removed (or removed and re-added) since pushed
        return None
