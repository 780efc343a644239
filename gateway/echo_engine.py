"""FakeEchoEngine: an instant stand-in for the real engine. FAKE — never serves a model.

It implements ``engine.protocol.EngineClient`` and echoes the prompt's tokens back, one per
step (cycling when ``max_tokens`` exceeds the prompt). It exists to measure the gateway alone
(``carpool bench gateway``, ``carpool serve --engine echo``) and to test gateway mechanics
(queues, WRR, multi-process) without paying for a forward pass. Tests that need real model
behaviour use ``engine.async_engine.AsyncEngine`` on a tiny random checkpoint.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engine.outputs import RequestOutput
from engine.protocol import EngineLoad, StepCallback
from engine.sampling_params import SamplingParams


@dataclass
class _EchoRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    priority: int
    produced: int = 0
    aborted: bool = False
    queue: asyncio.Queue[RequestOutput] | None = field(default=None, repr=False)


class FakeEchoEngine:
    """Echo engine (fake). ``step_ms`` is the pause between steps (0 = as fast as possible)."""

    def __init__(self, tokenizer: Any, model_name: str = "echo", max_model_len: int = 2048,
                 step_ms: float = 0.0, max_num_seqs: int = 256) -> None:
        self.tokenizer = tokenizer
        # Per-token text straight from the fast tokenizer when there is one (same text, ~8x
        # cheaper than the transformers wrapper): in ``--role all`` this fake engine's steps
        # run on the gateway's own event loop, and the bench should measure the gateway.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = (functools.partial(backend.decode, skip_special_tokens=False)
                        if backend is not None else tokenizer.decode)
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.step_s = step_ms / 1000.0
        self.max_num_seqs = max_num_seqs
        self._active: dict[str, _EchoRequest] = {}
        self._callbacks: list[StepCallback] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.num_steps = 0
        self.max_running_seen = 0
        self.started_ids: list[str] = []  # admission order (tests check WRR through it)

    async def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="fake-echo-engine")

    async def shutdown(self) -> None:
        for req in self._active.values():
            req.aborted = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0) -> None:
        if request_id in self._active:
            raise ValueError(f"duplicate request id {request_id!r}")
        self._active[request_id] = _EchoRequest(request_id, list(prompt_token_ids), params, priority)
        self.started_ids.append(request_id)
        self.max_running_seen = max(self.max_running_seen, len(self._active))
        self._wake.set()

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       priority: int = 0) -> AsyncIterator[RequestOutput]:
        self.add_request(request_id, prompt_token_ids, params, priority)
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._active[request_id].queue = q
        while True:
            out = await q.get()
            yield out
            if out.finished:
                return

    def abort(self, request_id: str) -> None:
        req = self._active.get(request_id)
        if req is not None:
            req.aborted = True

    def add_step_callback(self, callback: StepCallback) -> None:
        self._callbacks.append(callback)

    def load(self) -> EngineLoad:
        return EngineLoad(len(self._active), 0, 0, 1000, 1000, self.max_num_seqs,
                          max((r.priority for r in self._active.values()), default=None))

    def has_capacity(self, priority: int) -> bool:
        return len(self._active) < self.max_num_seqs

    async def _loop(self) -> None:
        while True:
            if not self._active:
                self._wake.clear()
                await self._wake.wait()
            outputs = [self._advance(r) for r in list(self._active.values())]
            self.num_steps += 1
            for out in outputs:
                if out.finished:
                    self._active.pop(out.request_id, None)
            for cb in self._callbacks:
                cb(outputs)
            await asyncio.sleep(self.step_s)

    def _advance(self, req: _EchoRequest) -> RequestOutput:
        n_prompt = len(req.prompt)
        if req.aborted:
            out = RequestOutput(req.request_id, [], "", True, "abort", n_prompt, req.produced)
        else:
            token = req.prompt[req.produced % n_prompt]
            req.produced += 1
            done = req.produced >= req.params.max_tokens
            out = RequestOutput(req.request_id, [token], self._decode([token]), done,
                                "length" if done else None, n_prompt, req.produced)
        if req.queue is not None:
            req.queue.put_nowait(out)
        return out
