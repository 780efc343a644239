"""Prefix-aware placement: which worker should run a prompt, so that prompts sharing a prefix
meet the prefix cache that holds it.

The key is the prompt's leading *full* KV blocks (``block_size`` tokens each, the same blocks
the engine's prefix cache names by content), at most ``max_blocks`` of them: two prompts with
the same leading blocks get the same key, whatever follows. A prompt shorter than one block
has no key (nothing to reuse): it goes to whoever is free.

The worker is chosen by rendezvous (highest-random-weight) hashing of the key over the live
workers: each worker scores ``hash(key, worker)`` and the highest wins. A worker that joins
or leaves moves only the keys it wins or won (about 1/n of them); every gateway computes the
same answer from the same worker list, with no shared table. Hashes are blake2b, never
Python's ``hash`` (salted per process).

Under skew (one prefix with half the traffic) pure hashing sends half the traffic to one
worker. ``bounded_choice`` caps it, as consistent hashing with bounded loads (Mirrokni,
Thorup, Zadimoghaddam, 2018) does: a worker that already got more than ``factor`` times the
mean share of the recent placements is passed over for the next in its rank order, so the
hot prefix spills to a second (then third) worker, each of which then caches it too.

The preference is a hint, not an assignment: the queue lets the preferred worker take the
entry first and any worker steal it after a short wait (``gateway/bus/scripts.py``,
``PICK_LUA``), so a busy or dead preferred worker never holds an entry longer than the wait.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_MAX_BLOCKS = 16  # 256 tokens at the engine's default 16-token block
DEFAULT_LOAD_FACTOR = 1.25
# The load bound counts a sliding window of the latest placements, this many per worker (at
# least MIN_WINDOW): a worker's share must be estimated over enough placements, or with many
# workers (30 workers, a 64-placement window: about 2 each) every prefix would be spread over
# most of them (engine/sim/fleet.py measured it: 10 workers a prompt, against 1-2).
WINDOW_PER_WORKER = 32
MIN_WINDOW = 64


def prefix_key(tokens: Sequence[int], block_size: int,
               max_blocks: int = DEFAULT_MAX_BLOCKS) -> bytes | None:
    """The placement key of a prompt: a digest of its first ``min(len // block_size,
    max_blocks)`` full blocks; None when it has no full block."""
    if block_size < 1 or max_blocks < 1:
        raise ValueError("block_size and max_blocks must be >= 1")
    n = min(len(tokens) // block_size, max_blocks) * block_size
    if n == 0:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for t in tokens[:n]:
        digest.update(int(t).to_bytes(4, "little", signed=True))
    return digest.digest()


def score(key: bytes, worker: str) -> int:
    """A worker's rendezvous weight for ``key``."""
    return int.from_bytes(hashlib.blake2b(key + b"\0" + worker.encode(),
                                          digest_size=8).digest(), "big")


def rank(key: bytes, workers: Iterable[str]) -> list[str]:
    """The workers in preference order for ``key`` (highest weight first; ties by name)."""
    return sorted(set(workers), key=lambda w: (-score(key, w), w))


def preferred_worker(tokens: Sequence[int], workers: Iterable[str], block_size: int,
                     max_blocks: int = DEFAULT_MAX_BLOCKS) -> str | None:
    """The worker a prompt should go to first, or None (no key, or no worker)."""
    key = prefix_key(tokens, block_size, max_blocks)
    if key is None:
        return None
    ranked = rank(key, workers)
    return ranked[0] if ranked else None


def window_size(workers: int) -> int:
    """How many of the latest placements the load bound counts, for ``workers`` workers."""
    return max(MIN_WINDOW, WINDOW_PER_WORKER * workers)


def bounded_choice(ranked: Sequence[str], recent: Mapping[str, int],
                   factor: float = DEFAULT_LOAD_FACTOR, window: int | None = None) -> str | None:
    """The first worker of ``ranked`` whose recent placements (``recent``: worker -> count over
    the latest placements) stay within ``factor`` x the mean once this one is added; the
    least placed if none does (``factor`` 0: no bound, ``ranked[0]``). The mean is over
    ``window`` placements when given (a sliding window's size: a window still filling, as
    after a start, bounds nobody until a worker holds ``factor`` x its share of a full one),
    else over those in ``recent`` and this one."""
    if not ranked:
        return None
    if factor <= 0:
        return ranked[0]
    total = window if window is not None else sum(recent.get(w, 0) for w in ranked) + 1
    limit = factor * total / len(ranked)
    for w in ranked:
        if recent.get(w, 0) + 1 <= limit:
            return w
    return min(ranked, key=lambda w: (recent.get(w, 0), ranked.index(w)))
