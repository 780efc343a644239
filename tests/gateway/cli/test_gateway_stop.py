"""``carpool serve --role gateway`` against an external Redis (``REDIS_URL``) stopped by
SIGTERM: exit status 0 and no traceback, as with the embedded Redis. uvicorn re-raises the
SIGTERM it handled once its graceful stop is done; without ``exit_cleanly_on_sigterm`` the
process then died of the signal (status -15)."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from tests.gateway.procs import spawn

pytestmark = pytest.mark.timeout(120)


def test_sigterm_stops_a_gateway_on_an_external_redis_with_status_0(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    ns = f"gs{uuid.uuid4().hex[:8]}"
    with spawn("gateway", redis_url, ns, tiny_model_dir, tmp_path) as gw:
        gw.popen.send_signal(signal.SIGTERM)
        assert gw.popen.wait(20) == 0, "".join(gw.lines[-40:])
        gw._reader.join(5)
    assert "Traceback" not in "".join(gw.lines)
