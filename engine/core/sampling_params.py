"""Per-request sampling parameters (frozen; validated once at construction).

Semantics follow vLLM (which the OpenAI fields map onto):

- ``repetition_penalty`` (1.0 = off) divides positive / multiplies negative logits of every
  token seen in the prompt or the output so far.
- ``frequency_penalty`` / ``presence_penalty`` (0.0 = off) subtract ``count * f`` and
  ``(count > 0) * p`` from the logits of tokens in the output so far (not the prompt).
- ``logit_bias``: ``(token_id, bias)`` pairs added to those logits before sampling.
- ``min_tokens``: EOS and ``stop_token_ids`` are impossible (and stop strings unchecked)
  until that many tokens were generated.
- ``min_p`` (0 = off): drop tokens whose probability is below ``min_p`` times the best one's.
- ``n``: that many sequences from one prompt, sharing its KV blocks (``parallel_sampling``).
- ``logprobs``: None = none; k >= 0 = the sampled token's log-probability plus the k best
  alternatives, from the model's raw distribution (vLLM's default ``raw_logprobs``).
- ``structured``: the output must match this grammar (``engine.core.structured``): each step
  the row's logits outside the grammar's allowed tokens are -inf, before the processors
  above, so they and the logprobs see the constrained distribution (as in vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.core.structured import StructuredSpec

GREEDY_BELOW = 1e-5
MAX_LOGPROBS = 20  # OpenAI's top_logprobs cap, vLLM's default max_logprobs


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
    min_tokens: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = field(default=())
    logprobs: int | None = None
    n: int = 1  # sequences per request (engine.core.parallel_sampling)
    structured: StructuredSpec | None = None

    def __post_init__(self) -> None:
        # Accept lists/str/dicts from callers, store tuples so the object stays hashable/frozen.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
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
        self._check_extras()
        # read per request per step on the hot path: computed once (not dataclass fields)
        history = (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                   or self.frequency_penalty != 0.0)
        object.__setattr__(self, "_needs_history", history)
        object.__setattr__(self, "_processes_logits",
                           history or bool(self.logit_bias) or self.min_tokens > 0)
        object.__setattr__(self, "_reads_history", history or self.structured is not None)

    def _check_extras(self) -> None:
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if any(t < 0 or not math.isfinite(b) for t, b in self.logit_bias):
            raise ValueError("logit_bias needs token ids >= 0 and finite biases")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows (and is argmax in the limit anyway).
        return self.temperature < GREEDY_BELOW

    @property
    def needs_history(self) -> bool:
        """Whether sampling reads the tokens seen so far (the penalties do)."""
        return self._needs_history  # type: ignore[no-any-return,attr-defined]

    @property
    def reads_history(self) -> bool:
        """Whether the runner needs the tokens so far: the penalties read them, and a
        grammar's matcher is rebuilt from them when it is not in step (a preempted or new
        sequence)."""
        return self._reads_history  # type: ignore[no-any-return,attr-defined]

    @property
    def processes_logits(self) -> bool:
        """Whether the logits change before temperature/top-k/top-p (see the module doc)."""
        return self._processes_logits  # type: ignore[no-any-return,attr-defined]


def _bias_pairs(value: Mapping[int, float] | Iterable[tuple[int, float]]
                ) -> tuple[tuple[int, float], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((int(t), float(b)) for t, b in items)
