"""Hook points for observability (issue #5). The gateway and worker call these; the base class
does nothing. A metrics/tracing implementation subclasses ``GatewayEvents`` and is passed to
``create_app``/``Worker`` — no other code changes. Hooks must be cheap and must not raise.
Never pass API keys here: tenants are named by id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.core.outputs import RequestOutput
from policies.admission import EngineLoad
from policies.ttft_split import WorkerMarks


class GatewayEvents:
    # -- lifecycle (the app's lifespan) ---------------------------------------------------
    async def start(self, services: Any) -> None:
        """The process's services exist (engine and worker too with ``--role all``)."""

    async def stop(self) -> None:
        pass

    # -- gateway (HTTP side) --------------------------------------------------------------
    def request_started(self, request_id: str, tenant_id: str, tier: str, model: str,
                        prompt_tokens: int, max_tokens: int | None, stream: bool,
                        incoming_traceparent: str | None) -> str | None:
        """Before enqueue; returns the W3C traceparent for the envelope (the request's span,
        so the worker's spans join its trace). The base passes the client's own through."""
        return incoming_traceparent

    def tokens(self, request_id: str, count: int) -> None:
        """``count`` new tokens of the request reached its relay (one call per TokenMsg)."""

    def request_admitted(self, tenant_id: str, tier: str, request_id: str,
                         prompt_tokens: int, traceparent: str | None) -> None:
        pass

    def request_rejected(self, tenant_id: str | None, status: int, reason: str,
                         request_id: str | None = None, tier: str | None = None) -> None:
        """``tier`` when known (a shed names it; an auth failure comes before any)."""

    def first_token(self, request_id: str, tier: str, ttft_s: float,
                    split: Mapping[str, float] | None = None,
                    marks: WorkerMarks | None = None) -> None:
        """The first token reached the relay, ``ttft_s`` after the request arrived; with the
        worker's marks, ``split`` is the TTFT budget (``policies.ttft_split``)."""

    def request_finished(self, tenant_id: str, tier: str, request_id: str, finish_reason: str,
                         prompt_tokens: int, completion_tokens: int, total_s: float,
                         engine_finish_reason: str | None = None,
                         queue_wait_s: float | None = None,
                         num_preemptions: int | None = None) -> None:
        """``finish_reason``: completed | aborted | errored; ``engine_finish_reason``: the
        engine's stop | length | abort | error when a FinishMsg arrived, and with it the
        worker's ``queue_wait_s`` and ``num_preemptions`` when it sent them."""

    def request_cancelled(self, request_id: str, source: str) -> None:
        """source: disconnect | explicit | deadline | stalled | shutdown"""

    # -- worker ---------------------------------------------------------------------------
    def dispatched(self, tier: str, request_id: str, queue_wait_s: float,
                   traceparent: str | None = None) -> None:
        pass

    def dropped(self, request_id: str, reason: str) -> None:
        """An envelope not run: cancelled while queued, past its deadline, reclaimed too late."""

    def engine_step(self, num_outputs: int, load: EngineLoad,
                    outputs: Sequence[RequestOutput] = ()) -> None:
        pass


class CountingEvents(GatewayEvents):
    """Counts calls by hook name (tests and debugging)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _bump(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def request_admitted(self, *a: object, **k: object) -> None:
        self._bump("admitted")

    def request_rejected(self, tenant_id: str | None, status: int, reason: str,
                         request_id: str | None = None, tier: str | None = None) -> None:
        self._bump(f"rejected:{reason}")

    def request_finished(self, *a: object, **k: object) -> None:
        self._bump("finished")

    def request_cancelled(self, request_id: str, source: str) -> None:
        self._bump(f"cancelled:{source}")

    def dispatched(self, *a: object, **k: object) -> None:
        self._bump("dispatched")

    def dropped(self, request_id: str, reason: str) -> None:
        self._bump(f"dropped:{reason}")
