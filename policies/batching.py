"""Batching modes as admission policies: how many waiting requests may start this step.

Pure functions over an ``AdmissionSnapshot``. The scheduler asks ``admission_limit(mode,
snapshot)`` once per step and admits at most that many (still subject to blocks and the
token budget); it never branches on the mode itself.

The returned number is a cap from the *batching* rule only; the scheduler separately enforces
``max_num_seqs`` (where a strictly more urgent request may preempt a less urgent one), blocks
and the token budget.

- ``continuous``: admit whenever there is room (no cap of its own).
- ``static``: admit only when nothing is running; then fill up to max_num_seqs. The batch
  runs until its last member finishes. A batch whose filling was cut short by the token
  budget or by free blocks keeps filling on the next steps (``batch_filling``).
- ``dynamic``: like static, but a new batch starts only when it would be full (waiting >=
  max_num_seqs) or when the oldest waiting request has waited >= max_wait_ms.

Static and dynamic are request-level batching: a batch has a fixed shape until its last member
finishes, so a finished member's seat stays in the forward pass as a padding row (computed,
output discarded), as in padded ``generate`` and as seed 000 describes static batching ("the
GPU still computes for the empty seat"). ``padding_rows`` says how many; continuous refills
the seat instead, so it never pads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    now: float  # seconds, same clock as the requests' arrival times
    num_running: int
    num_waiting: int
    oldest_waiting_arrival: float | None
    max_num_seqs: int
    max_wait_ms: float
    batch_filling: bool  # the current batch started admitting and has not closed yet


AdmissionPolicy = Callable[[AdmissionSnapshot], int]


def _free_seats(s: AdmissionSnapshot) -> int:
    return max(0, s.max_num_seqs - s.num_running)


def continuous(s: AdmissionSnapshot) -> int:
    return s.num_waiting


def static(s: AdmissionSnapshot) -> int:
    if s.num_running == 0 or s.batch_filling:
        return _free_seats(s)
    return 0


def dynamic(s: AdmissionSnapshot) -> int:
    if s.batch_filling:
        return _free_seats(s)
    if s.num_running > 0 or s.num_waiting == 0:
        return 0
    full = s.num_waiting >= s.max_num_seqs
    waited_ms = 0.0 if s.oldest_waiting_arrival is None else (s.now - s.oldest_waiting_arrival) * 1e3
    return _free_seats(s) if full or waited_ms >= s.max_wait_ms else 0


def padding_rows(mode: str, batch_seats: int, num_running: int) -> int:
    """Seats of the current batch whose member already finished, for a fixed-shape mode."""
    if mode == "continuous" or num_running == 0:
        return 0
    return max(0, batch_seats - num_running)


POLICIES: dict[str, AdmissionPolicy] = {
    "continuous": continuous,
    "static": static,
    "dynamic": dynamic,
}


def get_admission_policy(mode: str) -> AdmissionPolicy:
    try:
        return POLICIES[mode]
    except KeyError:
        raise ValueError(f"unknown batching mode {mode!r}") from None
