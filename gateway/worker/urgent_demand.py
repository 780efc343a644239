"""What the urgent (interactive) tier asks of the engine: decode tokens per second, from the
requests the worker started and the output they came to.

``tokens_per_s`` is the requests started per second over the last ``window_s`` times the mean
output tokens of the last ``kept`` finished ones (None until one has finished);
``prompt_tokens_per_s`` the prompt tokens they brought per second. Arrivals, not
service: the step budget compares it with what the capped batch gives (``policies.owed_seats.
urgent_backlogged``), and owing the lower tiers seats slows the steps and the tokens served,
never the tokens asked. The worker calls ``started`` and ``finished`` on its event loop; the
step budget reads ``tokens_per_s`` there too.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 10.0  # the tier status's rate window: ~20 starts at 0.5x capacity on the dev box
KEPT = 64  # finished requests averaged for the output tokens a request comes to


class UrgentDemand:
    def __init__(self, window_s: float = WINDOW_S, kept: int = KEPT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._since = clock()
        self._starts: deque[tuple[float, int]] = deque()  # (when, prompt tokens)
        self._tokens: deque[int] = deque(maxlen=kept)

    def started(self, prompt_tokens: int = 0) -> None:
        """An urgent request with ``prompt_tokens`` was handed to the engine."""
        self._starts.append((self.clock(), prompt_tokens))

    def finished(self, output_tokens: int) -> None:
        """An urgent request finished with ``output_tokens``."""
        self._tokens.append(output_tokens)

    def tokens_per_s(self) -> float | None:
        """Decode tokens per second asked (None: no request has finished yet)."""
        if not self._tokens:
            return None
        return len(self._window()) / self._seen() * sum(self._tokens) / len(self._tokens)

    def starts_per_s(self) -> float:
        """Requests started per second (each brings one prompt: a prefill row)."""
        return len(self._window()) / self._seen()

    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens per second the started requests brought."""
        return sum(n for _, n in self._window()) / self._seen()

    def _window(self) -> deque[tuple[float, int]]:
        starts, since = self._starts, self.clock() - self.window_s
        while starts and starts[0][0] < since:
            starts.popleft()
        return starts

    def _seen(self) -> float:
        """A young worker has seen less than a window: its rate over what it has seen."""
        return max(min(self.window_s, self.clock() - self._since), 1.0)
