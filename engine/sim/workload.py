"""Workloads: what arrives when. A request is a ``RequestSpec``: arrival time (seconds from the
start), prompt length (or the prompt's token ids, where prefix sharing matters), exact output
length (the simulated runner never emits EOS), tier, tenant, and whether its output is
constrained by a grammar (each step it samples in then pays the cost model's mask term).

Builders: ``fixed`` (a named list, seed 000's A..E), ``at_once`` (N requests at t=0 cycling
through a length mix), ``poisson`` (exponential gaps, lengths drawn from distributions, tiers
by share), ``load_trace`` (a JSONL file, one request a line). All are deterministic for a
given seed.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from policies.tiers import TIER_PRIORITY, TIERS

SIM_ANSWER = 7  # every token the simulator's stand-in runner "samples" (its SIM_TOKEN)


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    output_len: int
    prompt_len: int = 8
    arrival: float = 0.0
    tier: str = "interactive"
    tenant: str = "default"
    prompt_ids: tuple[int, ...] = field(default=(), repr=False)  # () = synthetic, unique
    constrained: bool = False  # response_format / guided_* / tools: a grammar masks each token

    def __post_init__(self) -> None:
        if self.output_len < 1 or self.prompt_len < 1:
            raise ValueError(f"{self.request_id}: prompt and output lengths must be >= 1")
        if self.arrival < 0:
            raise ValueError(f"{self.request_id}: arrival must be >= 0 seconds")
        if self.tier not in TIER_PRIORITY:
            raise ValueError(f"{self.request_id}: unknown tier {self.tier!r} (one of {TIERS})")
        if self.prompt_ids and len(self.prompt_ids) != self.prompt_len:
            raise ValueError(f"{self.request_id}: prompt_ids must have prompt_len tokens")

    @property
    def priority(self) -> int:
        return TIER_PRIORITY[self.tier]


def constrained_at(index: int, share: float) -> bool:
    """Whether the ``index``-th request of a stream is constrained, ``share`` of them spread
    evenly (no random draw: a workload's other draws, hence its seed's requests, stay put)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"a constrained share must be in [0, 1], got {share!r}")
    return math.floor((index + 1) * share) > math.floor(index * share)


def fixed(output_lens: Mapping[str, int], prompt_len: int = 8) -> list[RequestSpec]:
    """Requests named by the mapping's keys, all at t=0, in its order (FCFS)."""
    return [RequestSpec(rid, n, prompt_len) for rid, n in output_lens.items()]


def at_once(n: int, output_mix: Sequence[int], prompt_len: int = 8) -> list[RequestSpec]:
    """``n`` requests at t=0, output lengths cycling through ``output_mix``."""
    if n < 1 or not output_mix:
        raise ValueError("need n >= 1 and a non-empty output mix")
    return [RequestSpec(f"r{i}", output_mix[i % len(output_mix)], prompt_len) for i in range(n)]


@dataclass(frozen=True)
class Lengths:
    """A length distribution: uniform integers in [low, high] (low == high: fixed)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"lengths need 1 <= low <= high, got {self.low}..{self.high}")

    @classmethod
    def parse(cls, raw: str) -> Lengths:
        """"128" or "64:256"."""
        low, _, high = raw.partition(":")
        try:
            return cls(int(low), int(high or low))
        except ValueError as e:
            raise ValueError(f"lengths {raw!r}: expected N or LOW:HIGH with 1 <= LOW <= HIGH "
                             f"({e})") from None

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


def poisson(rate: float, n: int, prompt: Lengths, output: Lengths,
            tier_shares: Mapping[str, float] | None = None, seed: int = 0,
            tenants: int = 1, constrained: float = 0.0) -> list[RequestSpec]:
    """``n`` requests with exponential gaps of mean ``1/rate`` seconds; each request's tier is
    drawn by ``tier_shares`` (default all interactive), its tenant round-robin, and a
    ``constrained`` share of them (spread evenly) constrained."""
    if not rate > 0 or n < 1 or tenants < 1:
        raise ValueError("need rate > 0, n >= 1 and tenants >= 1")
    shares = dict(tier_shares or {"interactive": 1.0})
    if any(v < 0 for v in shares.values()) or sum(shares.values()) <= 0:
        raise ValueError(f"tier shares must be >= 0 and not all 0: {shares}")
    rng = random.Random(seed)
    names, weights = list(shares), list(shares.values())
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        tier = rng.choices(names, weights)[0]
        out.append(RequestSpec(f"p{i}", output.draw(rng), prompt.draw(rng), t, tier,
                               f"tenant{i % tenants}",
                               constrained=constrained_at(i, constrained)))
    return out


def load_trace(path: str | Path) -> list[RequestSpec]:
    """JSONL, one object a line: ``{"arrival": s, "prompt_len": n, "output_len": n,
    "tier": ..., "tenant": ..., "id": ..., "constrained": bool}`` (all but the lengths
    optional)."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        out.append(RequestSpec(str(row.get("id", f"t{i}")), int(row["output_len"]),
                               int(row["prompt_len"]), float(row.get("arrival", 0.0)),
                               str(row.get("tier", "interactive")),
                               str(row.get("tenant", "default")),
                               constrained=bool(row.get("constrained", False))))
    return out


def total_output_tokens(specs: Iterable[RequestSpec]) -> int:
    return sum(s.output_len for s in specs)


def chat_sessions(rate: float, chats: int, prefixes: int, prefix_len: int, turns: int = 3,
                  turn_len: int = 24, output_len: int = 16, turn_gap_s: float = 5.0,
                  skewed: bool = False, seed: int = 0) -> list[RequestSpec]:
    """Multi-turn chats over ``prefixes`` shared system prompts of ``prefix_len`` tokens:
    chats start with exponential gaps (``rate`` turns/s in all), each picks a system prompt
    (evenly, or with ``skewed`` half the chats prompt 0) and sends ``turns`` turns
    ``turn_gap_s`` apart, each turn's prompt the previous one + its answer + ``turn_len`` new
    tokens: what prefix-aware placement is for (``engine/sim/fleet.py``)."""
    if not rate > 0 or min(chats, prefixes, prefix_len, turns, turn_len, output_len) < 1:
        raise ValueError("need rate > 0 and counts, lengths >= 1")
    rng = random.Random(seed)
    systems = [[(p * 7919 + j * 31) % 40000 + 1000 for j in range(prefix_len)]
               for p in range(prefixes)]
    t, out = 0.0, []
    for c in range(chats):
        t += rng.expovariate(rate / turns)
        p = (0 if c % 2 == 0 else 1 + (c // 2) % max(1, prefixes - 1)) if skewed \
            else c % prefixes
        ids = list(systems[p])
        for k in range(turns):
            ids += [50000 + (c * 131 + k * 17 + j) % 9000 for j in range(turn_len)]
            out.append(RequestSpec(f"c{c}t{k}", output_len, len(ids), t + k * turn_gap_s,
                                   prompt_ids=tuple(ids)))
            ids += [SIM_ANSWER] * output_len  # the simulated runner's answer (its one token)
    return out
