"""Finish reasons: the one vocabulary every layer reports a finished request with.

The engine sets one on each finished ``RequestOutput`` (from the request's final
``RequestStatus``, mapped in ``engine.core.request``); the worker carries it across Redis in
``FinishMsg``; the gateway puts it in OpenAI bodies and telemetry labels metrics and spans
with it. Nothing else spells these strings. Torch-free.
"""

from __future__ import annotations

from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens, or the model's context
    ABORT = "abort"  # cancelled: client gone, explicit cancel, deadline, stalled reader
    ERROR = "error"  # the engine or the worker failed the request


# Ran to a natural end (OpenAI's own finish reasons); the others are cut short.
COMPLETED: frozenset[str] = frozenset({FinishReason.STOP, FinishReason.LENGTH})
