"""engine.core.request_queue: the per-priority counts it keeps as requests come and go equal a
count of what is queued (the engine's stats read them every step)."""

from __future__ import annotations

import random
from collections import Counter

from engine.core.request import Request
from engine.core.request_queue import RequestQueue
from engine.core.sampling_params import SamplingParams


def test_priority_counts_follow_adds_and_removes() -> None:
    rng = random.Random(3)
    queue, queued = RequestQueue(), {}
    for i in range(2000):
        if queued and rng.random() < 0.45:
            rid = rng.choice(sorted(queued))
            assert queue.remove(rid) is queued.pop(rid)
        else:
            req = Request(f"r{i}", [1], SamplingParams(), priority=rng.randrange(4),
                          arrival_time=rng.random())
            queue.add(req)
            queued[req.request_id] = req
        if i % 50 == 0 or i > 1990:
            want = tuple(sorted(Counter(r.priority for r in queue).items()))
            assert queue.by_priority() == want
    assert queue.remove("absent") is None
    for rid in list(queued):
        queue.remove(rid)
    assert queue.by_priority() == () and not queue
