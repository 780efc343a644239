"""``carpool serve --role gateway`` against an external Redis (``REDIS_URL``) stopped by
SIGTERM: exit status 0 and no traceback, as with the embedded Redis. uvicorn re-raises the
SIGTERM it handled once its graceful stop is done; without ``exit_cleanly_on_sigterm`` the
process then died of the signal (status -15). A stream it relays finishes within its drain
deadline."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.gateway.faults.stack import StreamReader
from tests.gateway.harness import make_tenant
from tests.gateway.procs import spawn, spawn_all

pytestmark = pytest.mark.timeout(120)


def test_sigterm_stops_a_gateway_on_an_external_redis_with_status_0(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    ns = f"gs{uuid.uuid4().hex[:8]}"
    with spawn("gateway", redis_url, ns, tiny_model_dir, tmp_path) as gw:
        gw.popen.send_signal(signal.SIGTERM)
        assert gw.popen.wait(20) == 0, "".join(gw.lines[-40:])
        gw._reader.join(5)
    assert "Traceback" not in "".join(gw.lines)


def test_sigterm_lets_an_open_stream_finish_and_refuses_what_is_new(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Within its drain deadline a stopping gateway finishes the stream it relays (every
    token, ``[DONE]``, no error); from its next tick on (0.1 s) ``/readyz`` and new requests
    are never answered 200 (503 from the shutdown gate, or the connection refused: uvicorn
    has closed its listening socket); it exits 0 once the stream is done."""
    ns = f"gs{uuid.uuid4().hex[:8]}"
    key = make_tenant(redis_url, ns, "gw")
    body = {"model": "echo", "prompt": "a b c", "max_tokens": 150, "stream": True,
            "stream_options": {"include_usage": True}}  # 20 ms a step: ~3 s
    with spawn_all(redis_url, ns, tiny_model_dir, tmp_path, ("gateway", ["--drain-timeout", "20"]),
                   ("worker", ["--echo-step-ms", "20"])) as (gw, _):
        stream = StreamReader(gw.url, key, body)
        stream.start()
        assert stream.first.wait(30)
        gw.popen.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        seen: list[tuple[float, int | str]] = []  # (seconds after the SIGTERM, answer)
        while stream.is_alive():
            for path in ("/readyz", "/v1/models"):
                at = time.monotonic() - stopped
                try:
                    seen.append((at, httpx.get(gw.url + path, timeout=2, headers={
                        "Authorization": f"Bearer {key}"}).status_code))
                except httpx.HTTPError as exc:
                    seen.append((at, type(exc).__name__))
            time.sleep(0.1)
        assert gw.popen.wait(20) == 0, "".join(gw.lines[-40:])
        exited = time.monotonic() - stopped
        gw._reader.join(5)
    assert stream.done and not stream.errors, stream.errors
    assert stream.usage is not None and stream.usage["completion_tokens"] == 150
    # uvicorn looks at its exit flag every 0.1 s: a 200 sent before it did is no refusal
    assert len(seen) > 4 and all(at < 0.5 for at, got in seen if got == 200), seen
    assert exited < 15  # once the stream was done, not at the 20 s deadline
    assert "Traceback" not in "".join(gw.lines)
