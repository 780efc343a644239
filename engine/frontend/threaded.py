"""The threaded front shared by ``AsyncEngine`` and the FAKE echo engine: a step thread
behind an asyncio API (``engine.protocol.EngineClient``).

The event loop adds requests and aborts through an ``Inbox``; the step thread applies them at
the top of each step (so whatever the subclass steps is only ever touched by that thread),
steps, and hands each step's outputs to the loop with ``call_soon_threadsafe``. On the loop
``_dispatch`` routes each output to its ``generate`` caller (``OutputStreams``) and to every
step callback (the worker's pipelined Redis write), and forgets finished requests. Step
observers (``add_step_observer``) run on the step thread with the step's ``SchedulerOutput``.

Failure never hangs a caller: if the step thread dies, every live request ends with an
"error" output and later adds fail at once; ``shutdown`` ends every open stream with "abort".

Lifecycle: a request added before the first ``start`` waits in the inbox and runs once
started; one added after ``shutdown`` (until the next ``start``) fails at once. When the step
loop stops, the step thread drops what the inbox still holds and aborts every request the
engine still holds (``_abort_all``), so their KV blocks are free and a later ``start`` runs
only requests added after it.

A constrained request (``SamplingParams.structured``) is posted only once its grammar is
compiled: ``_prepare`` hands back the compile's future, and its callback posts the request (or
ends it with an error, or with "abort" when it was aborted meanwhile). A slow schema delays only
its own request; the step thread never waits on a compile.

A subclass implements ``_steps`` (the step loop, until ``_stop`` is set), ``_add`` and
``_abort`` (apply an inbox message, on the step thread), ``_abort_all``, ``load`` and
``stats``; it may check prompts in the caller (``_check_prompt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.stats import EngineStats
from engine.frontend.inbox import Inbox
from engine.frontend.output_streams import OutputStreams
from engine.protocol import StepCallback, StepObserverFn
from policies.admission import EngineLoad, engine_has_capacity

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 10.0


class ThreadedEngine:
    thread_name = "carpool-engine"

    def __init__(self) -> None:
        self._inbox = Inbox()  # requests and aborts for the step thread
        self._streams = OutputStreams()  # what ``generate`` callers wait on
        self._callbacks: list[StepCallback] = []
        self.step_observers: list[StepObserverFn] = []  # called on the step thread
        self._live: set[str] = set()  # added and not yet reported finished (event-loop side)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.step_error: BaseException | None = None
        self._compiling: dict[str, bool] = {}  # grammar being compiled -> aborted meanwhile

    # -- lifecycle (event loop) -------------------------------------------------------------

    async def start(self) -> None:
        """Start the step thread (idempotent; a start after ``shutdown`` runs a new one)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the step thread and end every open request with an "abort" output."""
        for rid in list(self._live):
            self.abort(rid)  # reported by the thread if it gets to them before it stops
        self._stop.set()
        self._wake_step_thread()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, _JOIN_TIMEOUT_S)
            if not self._thread.is_alive():  # else a restart would run a second one
                self._thread = None
        if self._thread is None:  # no step thread to take them: ended below, never run
            self._drop_requests()
        left = [RequestOutput(rid, [], "", True, FinishReason.ABORT) for rid in self._live]
        if left:  # the thread may stop before it reports those aborts
            self._dispatch(left)

    def _wake_step_thread(self) -> None:
        """Wake a step thread that waits, so it sees the stop flag."""
        self._inbox.wake()

    @property
    def healthy(self) -> bool:
        """False once the step thread has died (or before start): /readyz reports it."""
        return self.step_error is None and self._thread is not None and self._thread.is_alive()

    # -- requests (event loop) --------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0, first_token_urgent: bool = False) -> None:
        if request_id in self._live:
            raise ValueError(f"duplicate request id {request_id!r}")
        ids = list(prompt_token_ids)
        self._check_prompt(ids)  # here, in the caller: on the step thread it would kill it
        self._live.add(request_id)
        if self._loop is not None and not self.healthy:  # died or shut down: never hang it
            self._publish(_errors([request_id], self.step_error or RuntimeError("engine not running")))
            return
        args = (request_id, ids, params, priority, first_token_urgent)
        compiling = self._prepare(params)
        if compiling is None or (compiling.done() and compiling.exception() is None):
            self._inbox.post("add", args, priority)
            return
        self._compiling[request_id] = False
        compiling.add_done_callback(
            lambda f: self._call_on_loop(self._compiled, args, f))

    def _prepare(self, params: SamplingParams) -> Future[None] | None:
        """A future done when the request can be posted (its grammar compiled); None: at
        once."""
        return None

    def _compiled(self, args: tuple[str, list[int], SamplingParams, int, bool],
                  compiling: Future[None]) -> None:
        """On the loop: a request's grammar compile ended: post it, or end it."""
        request_id = args[0]
        aborted = self._compiling.pop(request_id, True)
        error = None if compiling.cancelled() else compiling.exception()
        if request_id not in self._live:  # ended already (shutdown reported it)
            return
        if aborted or compiling.cancelled():
            self._dispatch([RequestOutput(request_id, [], "", True, FinishReason.ABORT)])
        elif error is not None:
            self._dispatch([RequestOutput(request_id, [], "", True, FinishReason.ERROR,
                                          error=f"structured output: {error}")])
        elif not self.healthy:
            self._dispatch(_errors([request_id], self.step_error
                                   or RuntimeError("engine not running")))
        else:
            self._inbox.post("add", args, args[3])

    def _check_prompt(self, token_ids: list[int]) -> None:
        """Raise ValueError for a prompt the engine cannot take (default: any is fine)."""

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 priority: int = 0) -> AsyncIterator[RequestOutput]:
        return self._streams.generate(
            request_id, lambda: self.add_request(request_id, prompt_token_ids, params, priority),
            lambda: self.abort(request_id))

    def abort(self, request_id: str) -> None:
        if request_id in self._compiling:  # not posted yet: ends when its compile does
            self._compiling[request_id] = True
            return
        self._inbox.post("abort", request_id)

    def add_step_callback(self, callback: StepCallback) -> None:
        self._callbacks.append(callback)

    def add_step_observer(self, observer: StepObserverFn) -> Callable[[], None]:
        self.step_observers.append(observer)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self.step_observers.remove(observer)

        return remove

    # -- load -------------------------------------------------------------------------------

    def load(self) -> EngineLoad:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError

    def has_capacity(self, priority: int) -> bool:
        return self.healthy and engine_has_capacity(self.load(), priority)

    # -- step thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._steps()
            self._end_stopped()
        except Exception as exc:  # surface to callers instead of hanging them
            logger.exception("%s step thread died; failing every request", self.thread_name)
            self.step_error = exc
            self._call_on_loop(self._fail_live, exc)

    def _steps(self) -> None:
        raise NotImplementedError

    def _end_stopped(self) -> None:
        """Once the step loop stopped: ``shutdown`` reports every live request aborted, so
        the engine must not keep one (a restart would run it again, its blocks stay held).
        The inbox's adds and aborts are moot: everything the engine holds is aborted."""
        self._drop_requests()
        outputs = self._abort_all()
        if outputs:  # the engine's own final outputs, ahead of shutdown's fallback
            self._publish(outputs)

    def _drop_requests(self) -> None:
        """Empty the inbox with no step thread running: requests and aborts are dropped (their
        callers get shutdown's abort), settings ("call") are applied, so a restart keeps them."""
        for kind, payload in self._inbox.drain():
            if kind == "call":
                payload()

    def _abort_all(self) -> list[RequestOutput]:
        """On the step thread: abort every request the engine holds; return their final
        outputs."""
        raise NotImplementedError

    def _drain_inbox(self) -> None:
        for kind, payload in self._inbox.drain():
            if kind == "add":
                self._add(*payload)
            elif kind == "call":  # a runtime setting applied between steps (set_urgent_row_cap)
                payload()
            else:
                self._abort(payload)

    def _add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
             priority: int, first_token_urgent: bool) -> None:
        raise NotImplementedError

    def _abort(self, request_id: str) -> None:
        raise NotImplementedError

    def _observe(self, out: SchedulerOutput, seconds: float) -> None:
        for observe in tuple(self.step_observers):  # a copy: the loop may add one meanwhile
            observe(out, seconds)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        """From any thread: hand ``outputs`` to the event loop."""
        self._call_on_loop(self._dispatch, outputs)

    def _call_on_loop(self, fn: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us: nobody takes outputs any more
            self._stop.set()

    # -- event loop -------------------------------------------------------------------------

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._streams.put(out)
            if out.finished:
                self._live.discard(out.request_id)
        for cb in self._callbacks:
            cb(outputs)

    def _fail_live(self, exc: BaseException) -> None:
        if self._live:
            self._dispatch(_errors(list(self._live), exc))


def _errors(request_ids: list[str], exc: BaseException) -> list[RequestOutput]:
    return [RequestOutput(rid, [], "", True, FinishReason.ERROR, error=f"engine failed: {exc!r}")
            for rid in request_ids]
