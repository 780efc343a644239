"""FakeEchoEngine: an instant stand-in for the real engine. FAKE — never serves a model.

It implements ``engine.protocol.EngineClient`` and echoes the prompt's tokens back, one per
step (cycling when ``max_tokens`` exceeds the prompt). It exists to measure the gateway alone
(``carpool bench gateway``, ``carpool serve --engine echo``) and to test gateway mechanics
(queues, WRR, multi-process) without paying for a forward pass. Tests that need real model
behaviour use ``engine.frontend.async_engine.AsyncEngine`` on a tiny random checkpoint.

It runs like the real ``AsyncEngine``: steps on a thread of their own, outputs handed to the
event loop with ``call_soon_threadsafe``, requests and aborts passed in through an inbox. A
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

import asyncio
import functools
import logging
import random
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine.core.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.inbox import Inbox
from engine.frontend.output_streams import OutputStreams
from engine.protocol import StepCallback
from policies.admission import EngineLoad, engine_has_capacity

log = logging.getLogger("carpool.worker")

_IDLE_WAIT_S = 0.5  # the step thread re-checks its stop flag this often when idle
MAX_AHEAD = 8  # steps whose outputs the loop has not handed out yet


@dataclass
class _EchoRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    produced: int = 0
    aborted: bool = False


class FakeEchoEngine:
    """Echo engine (fake). ``step_ms`` is the mean time from one step's start to the next's,
    each within ``step_ms * (1 +- step_jitter)``."""

    def __init__(self, tokenizer: Any, model_name: str = "echo", max_model_len: int = 2048,
                 step_ms: float = 0.0, max_num_seqs: int = 256, step_jitter: float = 0.2,
                 seed: int = 0) -> None:
        if not 0 <= step_jitter < 1 or step_ms < 0:
            raise ValueError("need step_ms >= 0 and 0 <= step_jitter < 1")
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
        self._inbox = Inbox()  # requests and aborts for the step thread
        self._ahead = threading.Semaphore(MAX_AHEAD)  # a step's outputs not yet handed out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # event-loop side: added and not yet reported finished (id -> priority)
        self._live: dict[str, int] = {}
        self._streams = OutputStreams()  # what ``generate`` callers wait on
        self._callbacks: list[StepCallback] = []
        self.num_steps = 0
        self.max_running_seen = 0
        self.started_ids: list[str] = []  # admission order (tests check WRR through it)

    async def start(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._stop.clear()
            self._ahead = threading.Semaphore(MAX_AHEAD)
            self._thread = threading.Thread(target=self._run, name="fake-echo-engine",
                                            daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        self._stop.set()
        self._inbox.wake()
        self._ahead.release(MAX_AHEAD)  # a step thread waiting on the loop stops now
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            if not self._thread.is_alive():  # else a restart would run a second one
                self._thread = None
        for _ in self._inbox.drain():  # ended below: a restart must not run them
            pass
        left = [RequestOutput(rid, [], "", True, "abort") for rid in list(self._live)]
        if left:  # end every open stream, as the real engine does at shutdown
            self._dispatch(left)

    # -- requests (event loop) --------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0) -> None:
        if request_id in self._live:
            raise ValueError(f"duplicate request id {request_id!r}")
        self._live[request_id] = priority
        self.started_ids.append(request_id)
        self.max_running_seen = max(self.max_running_seen, len(self._live))
        self._inbox.post("add", _EchoRequest(request_id, list(prompt_token_ids), params))

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 priority: int = 0) -> AsyncIterator[RequestOutput]:
        return self._streams.generate(
            request_id, lambda: self.add_request(request_id, prompt_token_ids, params, priority),
            lambda: self.abort(request_id))

    def abort(self, request_id: str) -> None:
        self._inbox.post("abort", request_id)

    def add_step_callback(self, callback: StepCallback) -> None:
        self._callbacks.append(callback)

    def load(self) -> EngineLoad:
        # lowest_running_priority None: the echo engine never preempts, so a full one has no
        # room at any priority.
        return EngineLoad(len(self._live), 0, 0, 1000, 1000, self.max_num_seqs, None)

    def has_capacity(self, priority: int) -> bool:
        return engine_has_capacity(self.load(), priority)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        self._ahead.release()
        for out in outputs:
            self._streams.put(out)
            if out.finished:
                self._live.pop(out.request_id, None)
        for cb in self._callbacks:
            cb(outputs)

    # -- step thread ------------------------------------------------------------------------

    def _run(self) -> None:
        active: dict[str, _EchoRequest] = {}
        try:
            self._steps(active)
        except Exception as exc:  # end every request rather than hang it, as AsyncEngine does
            log.exception("fake echo engine step thread died")
            self._hand_out([RequestOutput(rid, [], "", True, "error", error=repr(exc))
                            for rid in active])

    def _steps(self, active: dict[str, _EchoRequest]) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._drain_inbox(active)
            if not active:
                self._inbox.wait(_IDLE_WAIT_S)
                next_at = time.monotonic()
                continue
            if not self._room_ahead():
                return
            outputs = [self._advance(r) for r in active.values()]
            for out in outputs:
                if out.finished:
                    del active[out.request_id]
            self.num_steps += 1
            self._hand_out(outputs)
            next_at += self.step_s * (1 + self.step_jitter * self._rng.uniform(-1, 1))
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:  # late (a busy machine): this step starts now, the cadence counts from it
                next_at = time.monotonic()

    def _room_ahead(self) -> bool:
        """Wait until fewer than MAX_AHEAD steps' outputs are waiting for the loop; False if
        the engine is stopping or its loop is gone (the thread must end, not wait forever)."""
        assert self._loop is not None
        while not self._ahead.acquire(timeout=_IDLE_WAIT_S):
            if self._stop.is_set() or self._loop.is_closed():
                return False
        return not self._stop.is_set()

    def _drain_inbox(self, active: dict[str, _EchoRequest]) -> None:
        for kind, payload in self._inbox.drain():
            if kind == "add":
                active[payload.request_id] = payload
            elif payload in active:
                active[payload].aborted = True

    def _hand_out(self, outputs: list[RequestOutput]) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._dispatch, outputs)
        except RuntimeError:  # the loop closed under us: nobody takes outputs any more
            self._stop.set()

    def _advance(self, req: _EchoRequest) -> RequestOutput:
        n_prompt = len(req.prompt)
        if req.aborted:
            return RequestOutput(req.request_id, [], "", True, "abort", n_prompt, req.produced)
        token = req.prompt[req.produced % n_prompt]
        req.produced += 1
        done = req.produced >= req.params.max_tokens
        return RequestOutput(req.request_id, [token], self._decode([token]), done,
                             "length" if done else None, n_prompt, req.produced)
