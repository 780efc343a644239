"""The engine behind an asyncio front: the step loop runs in its own thread.

Callers on the event loop add requests and aborts through a thread-safe inbox; the step
thread applies them at the step boundary (so the scheduler is only ever touched by one
thread), runs ``LLMEngine.step()``, and hands each step's outputs back to the loop, where
they fan out to per-request queues (``generate``) and to step callbacks (the worker's
pipelined Redis write).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from engine.core.config import EngineConfig
from engine.core.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.inbox import Inbox
from engine.frontend.output_streams import OutputStreams
from engine.llm_engine import LLMEngine
from engine.protocol import StepCallback
from engine.runner.fresh_thread import run_on_fresh_thread
from policies.admission import EngineLoad, engine_has_capacity

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
_HOLD_WAIT_S = 0.002


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None):
        if engine is None:  # built off this thread: see engine.runner.fresh_thread
            engine = run_on_fresh_thread(lambda: LLMEngine(config or EngineConfig()), "carpool-load")
        self.engine = engine
        self.model_name: str = self.engine.model_name
        self.max_model_len: int = self.engine.max_model_len
        self.tokenizer: Any = self.engine.tokenizer
        self._inbox = Inbox()  # requests and aborts for the step thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams = OutputStreams()  # what ``generate`` callers wait on
        self._callbacks: list[StepCallback] = []
        self._live: set[str] = set()  # added and not yet reported finished (event-loop side)
        self.step_error: BaseException | None = None

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> AsyncEngine:
        return cls(EngineConfig.from_kwargs(**kwargs))

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="carpool-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        for rid in list(self._live):
            self.abort(rid)
        self._stop.set()
        self._inbox.wake()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            self._thread = None
        # The thread may stop before it reports those aborts: end every open stream here.
        left = [RequestOutput(rid, [], "", True, "abort") for rid in list(self._live)]
        if left:
            self._dispatch(left)

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
        priority: int = 0,
    ) -> None:
        if request_id in self._live:
            raise ValueError(f"duplicate request id {request_id!r}")
        ids = list(prompt_token_ids)
        self.engine.check_prompt(ids)  # here, in the caller: on the step thread it'd kill it
        self._live.add(request_id)
        if not self.healthy:  # the step thread died: fail the request now, never hang it
            self._fail([request_id], self.step_error or RuntimeError("engine not running"))
            return
        self._inbox.post("add", (request_id, ids, params, priority))

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        return self._streams.generate(
            request_id, lambda: self.add_request(request_id, prompt_token_ids, params, priority),
            lambda: self.abort(request_id))

    def abort(self, request_id: str) -> None:
        self._inbox.post("abort", request_id)

    def add_step_callback(self, callback: StepCallback) -> None:
        self._callbacks.append(callback)

    # -- load -----------------------------------------------------------------------------

    def load(self) -> EngineLoad:
        s = self.engine.stats
        return EngineLoad(
            num_running=s.num_running,
            num_waiting=s.num_waiting + self._inbox.qsize(),
            num_swapped=s.num_swapped,
            num_free_blocks=s.num_free_blocks,
            num_total_blocks=s.num_total_blocks,
            max_num_seqs=self.engine.config.scheduler.max_num_seqs,
            lowest_running_priority=s.lowest_running_priority,
        )

    @property
    def healthy(self) -> bool:
        """False once the step thread has died (or before start): /readyz reports it."""
        return self.step_error is None and self._thread is not None and self._thread.is_alive()

    def has_capacity(self, priority: int) -> bool:
        return self.healthy and engine_has_capacity(self.load(), priority)

    # -- step thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_inbox()
                if not self.engine.has_unfinished_requests():
                    self._inbox.wait(_IDLE_WAIT_S)
                    continue
                outputs = self.engine.step()
                if outputs:
                    self._publish(outputs)
                elif self.engine.stats.num_scheduled_tokens == 0:
                    # e.g. dynamic batching holding requests for max_wait_ms: don't spin
                    self._inbox.wait(_HOLD_WAIT_S)
        except Exception as exc:  # surface to callers instead of hanging them
            logger.exception("engine step thread died; failing every request")
            self.step_error = exc
            self._fail(list(self._live), exc)

    def _drain_inbox(self) -> None:
        for kind, payload in self._inbox.drain():
            if kind == "add":
                rid, ids, params, priority = payload
                self.engine.add_request(ids, params, request_id=rid, priority=priority)
            else:
                self.engine.abort(payload)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._dispatch, outputs)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._streams.put(out)
            if out.finished:
                self._live.discard(out.request_id)
        for cb in self._callbacks:
            cb(outputs)

    def _fail(self, request_ids: list[str], exc: BaseException) -> None:
        if self._loop is None:
            return
        outs = [
            RequestOutput(rid, [], "", True, "error", error=f"engine failed: {exc!r}")
            for rid in request_ids
        ]
        self._publish(outs)
