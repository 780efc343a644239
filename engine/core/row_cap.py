"""The urgent row cap: which running rows sit out a step so that urgent work stays fast, and
which queued requests may start. Torch-free.

A runtime knob (``Scheduler.set_urgent_row_cap``; it changes while the engine runs, so it is
not in ``SchedulerConfig``). While a request of priority <= ``urgent_priority`` is running,
waiting or swapped, a step schedules at most ``cap`` rows in total: every urgent row first
(urgent work always jumps the queue), then lower-priority rows up to the cap. The lower seats
go to the lower priorities by smooth weighted round-robin over ``weights`` (priority ->
weight, the tiers' drain weights; scores carried from step to step so the shares hold over
time; strict priority order without weights) among those with demand (running rows and queued
requests), and within a priority to the running rows that ran least recently (so they take
turns), then by arrival; a priority's seats its running rows leave unused let that many of its
queued requests start. The running rows left over are *held back*: skipped for this step,
keeping their KV blocks (paused, no recompute cost; only the usual memory rules preempt them).
With no urgent request present no cap applies.

Interactive may not starve the others when it alone overloads the engine: when ``weights``
also weighs the urgent priority, the lower priorities with demand are owed seats on top of
the cap for the urgent rows *past the cap* (urgent work filling the protected batch on its
own), and for every urgent row once they pass three caps, or at once while the worker judges
the urgent tier backlogged (``urgent_backlogged``: it asks more than the capped batch gives)
(``policies.owed_seats``: their weights' share of those rows, the total floored once and
spread by the weighted round-robin, so best-effort gets its fraction over time). So with every
tier backlogged the rows follow the weights, while urgent work within the cap that is not
backlogged keeps it whole (bench sla: owing seats for every urgent row took interactive's TPOT
to 2x alone at 0.5x capacity, ten urgent rows beside a cap of seven).

Why: a step's cost grows with its rows, so every lower-tier row slows every urgent one; the
cap (set by the worker from a step-cost model and a TPOT target) bounds the urgent rows'
step time.

A row counts as one token only while it decodes: a lower-priority prompt entering the batch
costs its whole length in one step (on a CPU a prefill token costs about what a decode row
does). So while urgent work is present, ``lower_prefill_tokens`` (optional) bounds the prompt
tokens lower-priority rows compute in one step, split over the lower priorities with prompt
work this step by ``weights`` (else the most urgent of them, always backlogged under overload,
took it all and best-effort's seats sat unstarted: 0.28 of its WRR share instead of 0.75);
longer prompts are chunked over several steps
(bench sla, --max-num-seqs 32: six bulk requests starting in one step made it ~250 ms longer,
and every interactive request arriving then paid it in TTFT). Seats owed past the cap add as
many prompt tokens to the allowance: a lower request brings about as many prompt tokens as
it yields output tokens, so owed seats without their prompts could never be turned over
(bench sla, every tier backlogged: 16 tokens a step held the lower tiers to ~16 rows' worth
of new work beside 75 interactive rows). A step that computes an urgent prompt (an urgent
request waiting to start, or an urgent row still prefilling) gets no lower prompt tokens
unless seats are owed: that step is the urgent request's first token (bench sla's 32-seat
row, traced: each of the 9 interactive TTFTs over 1.3x alone's p99 had its prompt's step carry
3-16 lower prompt tokens, 141-223 ms against ~114 alone; a lower prefill row costs ~10-13 ms
beside its ~1.6 ms a token).

The allowance is an average a step (``lower_prefill_chunk``, ``PrefillCredit``): each step
with lower prompt work banks it, and once the bank holds a chunk that step computes all of it.
Why: a chunk is a prefill row, whose fixed cost (~10-13 ms on the AVX-512 Xeon, ~40 ms on a
busy one) a step pays however few tokens it carries; a floor of 16 tokens in every step put
that cost on every step interactive ran (bench sla's overload TPOT 1.4-1.6x its budget),
where the same chunk every few steps keeps the mean step within the target.

A first token protected like an urgent arrival's. With no urgent work present, a request
marked ``first_token_urgent`` (the worker marks a tenant's request when it is under its share
of its tier and another tenant of that tier is over it) that still waits for its first token
makes its step an urgent arrival's: that step runs it and at most ``cap`` rows in all (the
others, the least recently run first, decode rows before prompt chunks), computes no other
prompt tokens and starts nothing else; the rows left out sit the step out with their KV kept.
Only that step: once it has its token the request is an ordinary row. Why (bench sla's heavy
row, traced): a light tenant's first token waited for the step in progress and then its own,
and its own carried the heavy tenant's ~38 rows and its one paced start (a step of 168-214 ms
against 45-63 ms alone). With urgent work present the urgent rules above apply unchanged:
interactive stays more urgent, and a marked request is an ordinary lower one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.core.request import Request
from engine.core.request_queue import RequestQueue
from policies.owed_seats import owed_seats
from policies.wrr import smooth_wrr_pick


@dataclass(frozen=True)
class RowCap:
    cap: int
    urgent_priority: int
    # priority -> weight for the seats; empty: strict priority order. The urgent priority's
    # own weight (optional) turns on the proportional seats owed to the lower priorities.
    weights: Mapping[int, int] = field(default_factory=dict)
    # Prompt tokens lower-priority rows may compute in one step while urgent work is
    # present; None: no bound beyond the step's token budget.
    lower_prefill_tokens: int | None = None
    # The urgent tier asks for more than its weight's share (the worker's judgement): the
    # lower priorities are owed seats for every urgent row, not only for those past the cap.
    urgent_backlogged: bool = False
    # The allowance is an average a step: tokens banked until at least this many, then
    # released in one step (``PrefillCredit``); 1: every step its allowance.
    lower_prefill_chunk: int = 1

    def __post_init__(self) -> None:
        if self.cap < 0:
            raise ValueError(f"row cap must be >= 0, got {self.cap}")
        if self.lower_prefill_tokens is not None and self.lower_prefill_tokens < 1:
            raise ValueError(f"lower prefill tokens must be >= 1, got {self.lower_prefill_tokens}")
        if self.lower_prefill_chunk < 1:
            raise ValueError(f"lower prefill chunk must be >= 1, got {self.lower_prefill_chunk}")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError(f"row cap weights must be >= 0, got {dict(self.weights)}")


@dataclass
class PrefillCredit:
    """The lower prompt tokens banked across steps. Each step with lower prompt work adds the
    allowance (at most ``max(allowance, chunk)`` are kept); once the bank holds a chunk, that
    step may compute all of it, and what it computed is spent."""

    tokens: float = 0.0
    scores: dict[int, int] = field(default_factory=dict)  # whose chunk is next (smooth WRR)

    def release(self, per_step: int, chunk: int) -> int:
        """Bank a step's ``per_step`` tokens; the tokens this step may compute (0 until the
        bank holds ``chunk``)."""
        self.tokens = min(self.tokens + per_step, max(per_step, chunk))
        return int(self.tokens) if self.tokens >= chunk else 0

    def spend(self, tokens: int) -> None:
        self.tokens = max(0.0, self.tokens - tokens)


@dataclass
class StepRowCap:
    """The cap as it applies to one step."""

    cap: int  # the rows this step may run (the cap, or more when lower seats are owed)
    urgent_priority: int
    held: frozenset[str]  # running rows that sit this step out
    starts: dict[int, int]  # lower priority -> queued requests it may still start this step
    # lower priority -> prompt tokens it may still compute this step (None: no bound)
    prefill_left: dict[int, int] | None = None
    # lower-priority requests whose first token this step protects: they run and start as
    # urgent ones do
    protected: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self._given = sum(self.prefill_left.values()) if self.prefill_left else 0

    def prefill_spent(self) -> int:
        """The lower prompt tokens computed so far this step (of those allowed)."""
        return self._given - (sum(self.prefill_left.values()) if self.prefill_left else 0)

    def token_budget(self, req: Request, budget: int, remaining: int) -> int:
        """The tokens ``req`` with ``remaining`` tokens to compute may compute this step out
        of ``budget`` (a decode row's one token is not prompt work)."""
        if (req.priority <= self.urgent_priority or self.prefill_left is None or remaining <= 1
                or req.request_id in self.protected):
            return budget
        return min(budget, self.prefill_left.get(req.priority, 0))

    def spend(self, priority: int, tokens: int) -> None:
        """A row of ``priority`` was scheduled ``tokens``: a lower prefill uses its priority's
        allowance (a decode row's one token is already counted as its row)."""
        left = self.prefill_left
        if priority > self.urgent_priority and tokens > 1 and left is not None:
            left[priority] = max(0, left.get(priority, 0) - tokens)

    def take_seat(self, req: Request) -> bool:
        """May swapped or waiting ``req`` start? Yes takes a seat of its priority (the
        scheduler asks once per request it then starts)."""
        if req.priority <= self.urgent_priority or req.request_id in self.protected:
            return True
        left = self.starts.get(req.priority, 0)
        if left <= 0:
            return False
        self.starts[req.priority] = left - 1
        return True


def _queued(queue: RequestQueue, counts: dict[int, int]) -> None:
    """Add ``queue``'s requests per priority to ``counts``."""
    if queue:
        for req in queue:
            counts[req.priority] = counts.get(req.priority, 0) + 1


def plan_step(cap: RowCap, running: Iterable[Request], waiting: RequestQueue,
              swapped: RequestQueue, scores: dict[int, int], free_seats: int = 1 << 30,
              credit: PrefillCredit | None = None) -> StepRowCap | None:
    """The rows held back and the starts allowed this step, or None when no urgent request
    (or protected first token) is present. ``scores`` are the weighted round-robin's,
    carried between steps (updated in place); ``free_seats``: requests that may still start
    (``max_num_seqs`` less the running ones); ``credit``: the lower prompt tokens banked
    (the caller spends what the step computed; None: a fresh bank)."""
    up = cap.urgent_priority
    head = [q.peek() for q in (waiting, swapped)]
    lower: dict[int, list[Request]] = {}
    urgent = 0
    urgent_prompt = False  # an urgent row computes prompt tokens this step
    for req in running:
        if req.priority <= up:
            urgent += 1
            urgent_prompt = urgent_prompt or req.num_tokens - req.num_computed_tokens > 1
        else:
            lower.setdefault(req.priority, []).append(req)
    urgent_waits = head[0] is not None and head[0].priority <= up  # it starts with its prompt
    if not urgent and not urgent_waits and not (head[1] is not None and head[1].priority <= up):
        return _first_token_step(cap, lower, waiting, swapped, scores, free_seats)
    queued: dict[int, int] = {}
    _queued(waiting, queued)
    _queued(swapped, queued)
    # Urgent requests still queued may start this step: their seats are reserved up front.
    urgent += sum(n for p, n in queued.items() if p <= up)
    demand = {p: len(lower.get(p, ())) + queued.get(p, 0)
              for p in set(lower) | set(queued) if p > up}
    owed = owed_seats(urgent, cap.cap, up, cap.weights, demand, cap.urgent_backlogged)
    seats = max(cap.cap - urgent, owed)
    for rows in lower.values():
        rows.sort(key=lambda r: (r.last_scheduled_step, r.arrival_time))
    alloc = _share_seats(seats, demand, cap.weights, scores)
    kept: set[str] = set()
    starts: dict[int, int] = {}
    for p, n in alloc.items():
        rows = lower.get(p, [])
        kept.update(r.request_id for r in rows[:n])
        starts[p] = max(0, n - len(rows))
    held = frozenset(r.request_id for rows in lower.values() for r in rows
                     if r.request_id not in kept)
    # Beside an urgent prompt, no lower prompt tokens (its first token waits for this step)
    # unless seats are owed: the lower tiers' share of the rows needs its prompts. Without an
    # allowance too (bench sla's 32-seat row: a step-cost fit that priced no token left it
    # unset, and interactive's prompt steps carried whole lower prompts, 202-222 ms against
    # ~150). Such a step still banks the allowance: it is an average over every step.
    urgent_first = (urgent_prompt or urgent_waits) and not owed
    prefill: dict[int, int] | None = {} if urgent_first else None
    if cap.lower_prefill_tokens is not None:
        prompting = {r.priority for rows in lower.values() for r in rows
                     if r.request_id in kept and r.num_tokens - r.num_computed_tokens > 1}
        prompting.update(p for p, n in starts.items() if n > 0)
        bank = PrefillCredit() if credit is None else credit
        released = bank.release(cap.lower_prefill_tokens + owed,
                                cap.lower_prefill_chunk) if prompting else 0
        given = released if not urgent_first else 0
        prefill = _give(given, prompting, cap, bank) if given else {}
    return StepRowCap(urgent + sum(alloc.values()), up, held, starts, prefill)


def _first_token_step(cap: RowCap, lower: Mapping[int, list[Request]], waiting: RequestQueue,
                      swapped: RequestQueue, scores: dict[int, int], free_seats: int
                      ) -> StepRowCap | None:
    """With no urgent work present: the step of the requests awaiting a protected first
    token (``Request.awaits_urgent_first_token``), or None when there is none (the common
    case). They run, with the other rows that fit under the cap (by the weights, the least
    recently run first, decode rows before prompt chunks), no other prompt tokens and no
    other start. Queued ones count only up to the free seats: one that cannot start must
    not cap step after step."""
    protected = [r for rows in lower.values() for r in rows if r.awaits_urgent_first_token]
    for queue in (waiting, swapped):
        if queue and free_seats > 0:
            queued = [r for r in queue if r.awaits_urgent_first_token][:free_seats]
            protected.extend(queued)
            free_seats -= len(queued)
    if not protected:
        return None
    ids = frozenset(r.request_id for r in protected)
    others = {p: sorted((r for r in rows if r.request_id not in ids),
                        key=lambda r: (r.num_tokens - r.num_computed_tokens > 1,
                                       r.last_scheduled_step, r.arrival_time))
              for p, rows in lower.items()}
    seats = max(0, cap.cap - len(protected))
    alloc = _share_seats(seats, {p: len(rows) for p, rows in others.items()}, cap.weights,
                         scores)
    kept = {r.request_id for p, n in alloc.items() for r in others[p][:n]}
    held = frozenset(r.request_id for rows in others.values() for r in rows
                     if r.request_id not in kept)
    return StepRowCap(len(protected) + len(kept), cap.urgent_priority, held, {}, {}, ids)


def _give(tokens: int, prompting: set[int], cap: RowCap, bank: PrefillCredit
          ) -> dict[int, int]:
    """The lower prompt tokens this step computes, per priority: with a chunk (banked
    allowance) all of them to one priority, picked by smooth WRR over ``cap.weights`` (each
    chunk one prefill row: split, it was two, each paying the row's fixed cost), so the
    shares hold over the chunks; else split by weight in every step."""
    if cap.lower_prefill_chunk <= 1 or len(prompting) == 1:
        return _split_tokens(tokens, prompting, cap.weights)
    weights = {p: max(1, cap.weights.get(p, 1)) for p in sorted(prompting)}
    pick, bank.scores = smooth_wrr_pick(weights, bank.scores, weights)
    return {} if pick is None else {pick: tokens}


def _split_tokens(tokens: int, priorities: Iterable[int], weights: Mapping[int, int]
                  ) -> dict[int, int]:
    """``tokens`` split over ``priorities`` by ``weights`` (1 without), each at least 1."""
    w = {p: max(1, weights.get(p, 1)) for p in priorities}
    total = sum(w.values())
    return {p: max(1, tokens * wp // total) for p, wp in w.items()}


def _share_seats(seats: int, demand: Mapping[int, int], weights: Mapping[int, int],
                 scores: dict[int, int]) -> dict[int, int]:
    """``seats`` spread over the lower priorities, none past its demand: by smooth WRR over
    ``weights`` (strict priority order without weights)."""
    order = sorted(p for p, n in demand.items() if n > 0)
    taken = dict.fromkeys(order, 0)
    if not weights:  # strict priority: the most urgent lower demand first
        for p in order:
            taken[p] = min(demand[p], seats - sum(taken.values()))
        return taken
    w = {p: weights.get(p, 1) for p in order}
    for _ in range(min(seats, sum(demand[p] for p in order))):
        left = [p for p in order if taken[p] < demand[p]]
        pick, new = smooth_wrr_pick(w, scores, left)
        if pick is None:
            break
        scores.update(new)
        taken[pick] += 1
    return taken
