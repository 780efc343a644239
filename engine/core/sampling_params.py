"""Per-request sampling parameters (frozen; validated once at construction)."""

from __future__ import annotations

from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature == 0 (or below 1e-5) means greedy. top_k == 0 and top_p == 1.0 disable those filters.
    A seed makes sampling reproducible whatever else is in the batch: the generator for
    output token i is derived from (seed, i) alone.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Accept lists/str from callers, store tuples so the object stays hashable/frozen.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows (and is argmax in the limit anyway).
        return self.temperature < GREEDY_BELOW
