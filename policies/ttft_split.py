"""The TTFT budget: where a request's time to first token went, in six consecutive parts.

    gateway_in         HTTP request received -> its envelope handed to Redis (auth, parse,
                       tokenize, shedding)
    redis_queue        -> the drainer read it (the admission script, then the queue)
    drainer_to_engine  -> the worker handed it to the engine (claim, decode, add_request)
    step_wait          -> the step that first scheduled it began (the step in flight, and any
                       step it sat out in the engine's waiting queue)
    prefill            -> the step that computed its first token ended (its prompt's steps)
    first_token_out    -> the gateway had the first token for its client (the worker's write,
                       Redis, the gateway's output mux)

The worker stamps its four marks (``WorkerMarks``) and sends them with the request's first
``TokenMsg``; the gateway adds its own two ends. The parts are differences of wall-clock
stamps taken on up to two hosts: each boundary is held at or after the one before it, so a
skew between the hosts shows as a zero part, never a negative one, and the parts always sum
to the whole. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass

PARTS = ("gateway_in", "redis_queue", "drainer_to_engine", "step_wait", "prefill",
         "first_token_out")
LABELS = {"gateway_in": "gateway in", "redis_queue": "Redis queue",
          "drainer_to_engine": "drainer to engine", "step_wait": "wait for the step in flight",
          "prefill": "prefill steps", "first_token_out": "first token out"}


@dataclass(frozen=True)
class WorkerMarks:
    """What the worker knows of a first token (wall-clock seconds, ``time.time()``)."""

    read_unix: float  # the drainer read the entry
    posted_unix: float  # handed to the engine
    scheduled_unix: float  # the step that first scheduled it began
    first_token_unix: float  # the step that computed its first token ended
    steps: int  # engine steps that ended from the read to the first token, that one included
    prefill_steps: int  # of which computed its prompt (chunked prompts take several)

    def to_list(self) -> list[float]:
        return list(astuple(self))

    @classmethod
    def of_list(cls, values: Sequence[float] | None) -> WorkerMarks | None:
        """Inverse of ``to_list``; None for anything else (an older or a newer sender)."""
        if values is None or len(values) != 6:
            return None
        try:
            floats = [float(v) for v in values]
        except (TypeError, ValueError):
            return None
        read, posted, scheduled, first, steps, prefill = floats
        return cls(read, posted, scheduled, first, int(steps), int(prefill))


def ttft_split(received_unix: float, enqueued_unix: float, marks: WorkerMarks,
               delivered_unix: float) -> dict[str, float]:
    """The six parts (seconds), in ``PARTS`` order; they sum to ``delivered_unix -
    received_unix`` (0 if that is negative)."""
    bounds = [received_unix, enqueued_unix, marks.read_unix, marks.posted_unix,
              marks.scheduled_unix, marks.first_token_unix, delivered_unix]
    for i in range(1, len(bounds)):
        bounds[i] = max(bounds[i], bounds[i - 1])
    return {part: bounds[i + 1] - bounds[i] for i, part in enumerate(PARTS)}


def largest_part(parts: Mapping[str, float | None]) -> str | None:
    """The part that took the most (``PARTS`` order breaks ties); None without figures."""
    known = [(v, -PARTS.index(k), k) for k, v in parts.items() if v is not None and k in PARTS]
    return max(known)[2] if known else None
