"""``Services``: built once in the app's lifespan, not reassigned; with ``--role all`` its worker
drives its engine."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.http.auth import AuthCache
from gateway.http.output_mux import OutputMux
from gateway.worker.worker import Worker


def test_built_once_and_frozen(echo_gateway: Any) -> None:
    svc = echo_gateway.services
    assert isinstance(svc.mux, OutputMux) and isinstance(svc.auth, AuthCache)
    assert isinstance(svc.worker, Worker)
    assert svc.worker.engine is svc.engine is not None
    assert svc.worker.events is svc.events
    with pytest.raises(dataclasses.FrozenInstanceError):
        svc.engine = None
