"""Hook points for observability (issue #5). The gateway and worker call these; the base class
does nothing. A metrics/tracing implementation subclasses ``GatewayEvents`` and is passed to
``create_app``/``Worker`` — no other code changes. Hooks must be cheap and must not raise.
Never pass API keys here: tenants are named by id.
"""

from __future__ import annotations

from engine.protocol import EngineLoad


class GatewayEvents:
    # -- gateway (HTTP side) --------------------------------------------------------------
    def request_admitted(self, tenant_id: str, tier: str, request_id: str,
                         prompt_tokens: int, traceparent: str | None) -> None:
        pass

    def request_rejected(self, tenant_id: str | None, status: int, reason: str) -> None:
        pass

    def first_token(self, request_id: str, tier: str, ttft_s: float) -> None:
        pass

    def request_finished(self, tenant_id: str, tier: str, request_id: str, finish_reason: str,
                         prompt_tokens: int, completion_tokens: int, total_s: float) -> None:
        pass

    def request_cancelled(self, request_id: str, source: str) -> None:
        """source: disconnect | explicit | deadline | stalled"""

    # -- worker ---------------------------------------------------------------------------
    def dispatched(self, tier: str, request_id: str, queue_wait_s: float) -> None:
        pass

    def dropped(self, request_id: str, reason: str) -> None:
        """An envelope not run: cancelled while queued, past its deadline, reclaimed too late."""

    def engine_step(self, num_outputs: int, load: EngineLoad) -> None:
        pass


class CountingEvents(GatewayEvents):
    """Counts calls by hook name (tests and debugging)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _bump(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def request_admitted(self, *a: object, **k: object) -> None:
        self._bump("admitted")

    def request_rejected(self, tenant_id: str | None, status: int, reason: str) -> None:
        self._bump(f"rejected:{reason}")

    def request_finished(self, *a: object, **k: object) -> None:
        self._bump("finished")

    def request_cancelled(self, request_id: str, source: str) -> None:
        self._bump(f"cancelled:{source}")

    def dispatched(self, *a: object, **k: object) -> None:
        self._bump("dispatched")

    def dropped(self, request_id: str, reason: str) -> None:
        self._bump(f"dropped:{reason}")
