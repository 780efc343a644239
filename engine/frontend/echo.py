"""FakeEchoEngine: an instant stand-in for the real engine. FAKE — never serves a model.

It implements ``engine.protocol.EngineClient`` and echoes the prompt's tokens back, one per
step (cycling when ``max_tokens`` exceeds the prompt). It exists to measure the gateway alone
(``carpool bench gateway``, ``carpool serve --engine echo``) and to test gateway mechanics
(queues, WRR, multi-process) without paying for a forward pass. Tests that need real model
behaviour use ``engine.frontend.async_engine.AsyncEngine`` on a tiny random checkpoint.

It runs like the real ``AsyncEngine``, on the same ``ThreadedEngine`` base: steps on a thread
of their own, outputs handed to the event loop with ``call_soon_threadsafe``, requests and
aborts passed in through an inbox, step observers fed a ``SchedulerOutput`` (one token per
request per step; it never preempts, so its load reports no preemptible work). A
step starts ``step_ms`` after the previous one started, as a real engine's forward pass does,
unless the loop is ``MAX_AHEAD`` steps behind in taking the outputs (a real engine is never
held back; the bound keeps ``step_ms=0``, "as fast as the loop takes outputs", from flooding
the loop). A fake that stepped on the gateway's own loop would bill the gateway's work to the
engine's cadence, and timers there are millisecond-granular. Step times vary uniformly by
``step_jitter`` around ``step_ms`` (seeded), as a real engine's do: with a fixed cadence, a
load generator's millisecond timers phase-lock with the steps, and a request's wait for the
next step (the same for every path through the gateway) stops being random.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput, ScheduledRequest, SchedulerOutput
from engine.core.row_cap import RowCap
from engine.core.sampling_params import SamplingParams
from engine.core.stats import EngineStats, SchedulerStats
from engine.frontend.threaded import ThreadedEngine
from policies.admission import EngineLoad

_IDLE_WAIT_S = 0.5  # the step thread re-checks its stop flag this often when idle
MAX_AHEAD = 8  # steps whose outputs the loop has not handed out yet
_BLOCKS = 1000  # the KV pool it reports: never used


@dataclass
class _EchoRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    priority: int = 0
    produced: int = 0
    aborted: bool = False


class FakeEchoEngine(ThreadedEngine):
    """Echo engine (fake). ``step_ms`` is the mean time from one step's start to the next's,
    each within ``step_ms * (1 +- step_jitter)``."""

    thread_name = "fake-echo-engine"

    def __init__(self, tokenizer: Any, model_name: str = "echo", max_model_len: int = 2048,
                 step_ms: float = 0.0, max_num_seqs: int = 256, step_jitter: float = 0.2,
                 seed: int = 0) -> None:
        if not 0 <= step_jitter < 1 or step_ms < 0:
            raise ValueError("need step_ms >= 0 and 0 <= step_jitter < 1")
        super().__init__()
        self.tokenizer = tokenizer
        # Per-token text straight from the fast tokenizer when there is one (same text, ~8x
        # cheaper than the transformers wrapper).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = (functools.partial(backend.decode, skip_special_tokens=False)
                        if backend is not None else tokenizer.decode)
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.step_s = step_ms / 1000.0
        self.step_jitter = step_jitter
        self._rng = random.Random(seed)  # used on the step thread only
        self.max_num_seqs = max_num_seqs
        self._ahead = threading.Semaphore(MAX_AHEAD)  # a step's outputs not yet handed out
        self._active: dict[str, _EchoRequest] = {}  # step thread only
        # (steps so far, last batch size, last step seconds): one tuple, replaced whole by
        # the step thread, so a reader on another thread sees a consistent triple.
        self._last_step: tuple[int, int, float | None] = (0, 0, None)
        self.urgent_row_cap: tuple[int | None, int] = (None, 0)  # (cap, urgent priority)

    async def start(self) -> None:
        if self._thread is None:
            self._ahead = threading.Semaphore(MAX_AHEAD)
        await super().start()

    def _wake_step_thread(self) -> None:
        super()._wake_step_thread()
        self._ahead.release(MAX_AHEAD)  # a step thread waiting on the loop stops now

    def load(self) -> EngineLoad:
        # lowest_running_priority None: the echo engine never preempts, so a full one has no
        # room at any priority.
        return EngineLoad(len(self._live), 0, 0, _BLOCKS, _BLOCKS, self.max_num_seqs, None)

    def set_urgent_row_cap(self, cap: int | None, urgent_priority: int = 0,
                           weights: Mapping[int, int] | None = None,
                           lower_prefill_tokens: int | None = None,
                           urgent_backlogged: bool = False,
                           lower_prefill_chunk: int = 1) -> None:
        """Recorded and reported in ``stats``, never applied: a fake step has no cost to cap."""
        if cap is not None:
            RowCap(cap, urgent_priority, dict(weights or {}),  # the engine's own checks
                   lower_prefill_tokens, lower_prefill_chunk=lower_prefill_chunk)
        self.urgent_row_cap = (cap, urgent_priority)

    def stats(self) -> EngineStats:
        steps, batch, seconds = self._last_step
        return EngineStats(SchedulerStats(
            num_running=len(self._live), num_scheduled_requests=batch,
            num_scheduled_tokens=batch, device_blocks_total=_BLOCKS, device_blocks_free=_BLOCKS,
            num_steps=steps, urgent_row_cap=self.urgent_row_cap[0]), seconds, steps)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        self._ahead.release()
        super()._dispatch(outputs)

    # -- step thread ------------------------------------------------------------------------

    def _add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
             priority: int, first_token_urgent: bool) -> None:
        self._active[request_id] = _EchoRequest(request_id, prompt_token_ids, params, priority)

    def _abort(self, request_id: str) -> None:
        if request_id in self._active:
            self._active[request_id].aborted = True

    def _abort_all(self) -> list[RequestOutput]:
        for req in self._active.values():
            req.aborted = True
        outputs = [self._advance(r) for r in self._active.values()]
        self._active.clear()
        return outputs

    def _steps(self) -> None:
        active = self._active = {}  # a restart starts empty
        next_at, began = time.monotonic(), None
        while not self._stop.is_set():
            self._drain_inbox()
            if not active:
                self._inbox.wait(_IDLE_WAIT_S)
                next_at, began = time.monotonic(), None
                continue
            if not self._room_ahead():
                return
            # The step's seconds, as a real engine's would be: since the last step began.
            now = time.monotonic()
            self._step(active, now - began if began is not None else self.step_s)
            began = now
            next_at += self.step_s * (1 + self.step_jitter * self._rng.uniform(-1, 1))
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:  # late (a busy machine): this step starts now, the cadence counts from it
                next_at = time.monotonic()

    def _step(self, active: dict[str, _EchoRequest], seconds: float) -> None:
        """One step: a token for every active request (``seconds`` go to the observers)."""
        reqs = list(active.values())
        outputs = [self._advance(r) for r in reqs]
        step, now = self._last_step[0] + 1, time.monotonic()
        for out in outputs:  # a first token: its prompt took this one step, as a real engine's
            if out.num_output_tokens == 1 and out.new_token_ids:
                out.first_scheduled_step = out.first_token_step = step
                out.first_scheduled_time, out.first_token_time = now - seconds, now
        for out in outputs:
            if out.finished:
                del active[out.request_id]
        self._last_step = (self._last_step[0] + 1, len(outputs), seconds)
        if self.step_observers:  # built only for someone who looks
            self._observe(_scheduler_output(reqs, outputs), seconds)
        self._publish(outputs)

    def _room_ahead(self) -> bool:
        """Wait until fewer than MAX_AHEAD steps' outputs are waiting for the loop; False if
        the engine is stopping or its loop is gone (the thread must end, not wait forever)."""
        assert self._loop is not None
        while not self._ahead.acquire(timeout=_IDLE_WAIT_S):
            if self._stop.is_set() or self._loop.is_closed():
                return False
        return not self._stop.is_set()

    def _advance(self, req: _EchoRequest) -> RequestOutput:
        n_prompt = len(req.prompt)
        if req.aborted:
            return RequestOutput(req.request_id, [], "", True, FinishReason.ABORT, n_prompt,
                                 req.produced)
        token = req.prompt[req.produced % n_prompt]
        req.produced += 1
        done = req.produced >= req.params.max_tokens
        return RequestOutput(req.request_id, [token], self._decode([token]), done,
                             FinishReason.LENGTH if done else None, n_prompt, req.produced)


def _scheduler_output(reqs: list[_EchoRequest], outputs: list[RequestOutput]) -> SchedulerOutput:
    """The step as a scheduler would describe it: one decode token per request."""
    scheduled = [
        ScheduledRequest(r.request_id, o.new_token_ids, len(r.prompt) + r.produced - 1, [],
                         True, r.params, r.produced - 1, priority=r.priority)
        for r, o in zip(reqs, outputs) if o.new_token_ids
    ]
    return SchedulerOutput(scheduled=scheduled,
                           finished_ids=[o.request_id for o in outputs if o.finished])
