"""Turns finished steps into ``RequestOutput`` deltas: incremental detokenization and stop
strings. Stop strings are matched on text, so they live here, after the scheduler's
token-level stop checks; a match finishes the request through ``Scheduler.finish_request``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from engine.core.request import Request


@dataclass
class _TextState:
    detok: IncrementalDetokenizer
    text: str = ""  # all text decoded so far (may run past a stop string)
    emitted: int = 0  # characters already sent to the caller
    sent_tokens: int = 0  # output tokens already sent
    stopped_at: int | None = None  # index in text where a stop string begins


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _TextState] = {}

    def add(self, request: Request) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids)
        self._states[request.request_id] = _TextState(detok=detok)

    def discard(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def request_ids(self) -> list[str]:
        """Every request added whose finished output was not produced yet."""
        return list(self._states)

    def process(self, request: Request) -> tuple[RequestOutput, bool]:
        """Returns the request's delta and whether a stop string just matched (the caller
        then finishes the request in the scheduler and marks the output finished)."""
        st = self._states.get(request.request_id)
        if st is None:  # a forked sequence of an n > 1 request (parallel_sampling)
            self.add(request)
            st = self._states[request.request_id]
        params = request.sampling_params
        new_tokens = request.output_token_ids[st.sent_tokens :]
        logprobs = request.output_logprobs[st.sent_tokens :] if params.logprobs is not None \
            else None
        st.sent_tokens = request.num_output_tokens
        stop_hit = False
        if new_tokens and st.stopped_at is None:
            st.text += st.detok.add(new_tokens)
            # as vLLM: no stop string ends a request short of min_tokens
            if request.num_output_tokens >= params.min_tokens:
                stop_hit = self._find_stop(st, params.stop)
        finished = request.is_finished or stop_hit
        if finished and st.stopped_at is None:
            st.text += st.detok.flush()  # a trailing partial character, if any
        delta = self._take_text(st, request.sampling_params.stop, finished)
        out = RequestOutput(
            request_id=request.request_id,
            new_token_ids=list(new_tokens),
            text_delta=delta,
            finished=finished,
            finish_reason=FinishReason.STOP if stop_hit else request.status.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            error=request.error,
            arrival_time=request.times.arrival,
            first_scheduled_time=request.times.first_scheduled,
            first_token_time=request.times.first_token,
            finish_time=request.times.finished,
            first_scheduled_step=request.times.first_scheduled_step,
            first_token_step=request.times.first_token_step,
            num_preemptions=request.num_preemptions,
            logprobs=logprobs,
            num_cached_tokens=request.num_cached_tokens,
        )
        if finished:
            self.discard(request.request_id)
        return out, stop_hit

    @staticmethod
    def _find_stop(st: _TextState, stops: tuple[str, ...]) -> bool:
        if not stops:
            return False
        # Only the new tail can contain a new match; look back by the longest stop's length.
        start = max(0, st.emitted - max(len(s) for s in stops))
        hits = [i for i in (st.text.find(s, start) for s in stops) if i >= 0]
        if hits:
            st.stopped_at = min(hits)
        return bool(hits)

    @staticmethod
    def _take_text(st: _TextState, stops: tuple[str, ...], finished: bool) -> str:
        end = len(st.text) if st.stopped_at is None else st.stopped_at
        if not finished and st.stopped_at is None and stops:
            # Hold back a tail that could still become a stop string.
            end -= _held_back(st.text, stops)
        if end <= st.emitted:
            return ""
        delta = st.text[st.emitted : end]
        st.emitted = end
        return delta


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-n:]):
                longest = n
                break
    return longest

